"""What runs inside one probe process. ``trials.contract`` is the only module tuner/ imports."""
