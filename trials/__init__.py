"""What runs inside one probe process. ``trials.contract`` is the only module tuner/ imports (it re-exports
``trials.status``, the one status vocabulary)."""
