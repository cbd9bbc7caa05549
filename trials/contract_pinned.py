"""How a probe's engine gets the pinned host memory CPU offload asks for (issue 41 §4), one half of the probe contract
(re-exported by trials.contract): the variant's name in the probe's environment (``PINNED_ALLOC_ENV``, set by the
runner from the ``pinned_alloc`` setting, never by the user's export) and its parsing, shared by both sides.

The variants (trials.pinned puts them in force around ``deepspeed.initialize``, on CUDA only):

* ``deepspeed`` (the default): as DeepSpeed does it, ``tensor.pin_memory()``: torch's caching host allocator,
  cudaHostAlloc of the size rounded up to a power of two, then a copy of the tensor into it;
* ``register:N``: the same calls with torch's ``pinned_use_cuda_host_register`` and ``pinned_num_register_threads:N``
  in force during the engine's setup (malloc, the pages touched by N threads, one cudaHostRegister);
* ``exact``: the tensor's own memory page-locked in place (cudaHostRegister of its bytes: no rounding, no copy).

Pure: no torch import."""

from __future__ import annotations

PINNED_ALLOC_ENV = "TUNER_PINNED_ALLOC"
PINNED_ALLOCS: tuple[str, ...] = ("deepspeed", "register", "exact")
DEFAULT_PINNED_ALLOC = "deepspeed"
#: torch's bounds on pinned_num_register_threads: a power of two, at most 128 (c10 AllocatorConfig)
MAX_REGISTER_THREADS = 128
#: the threads "register" gets when it names none: one per core, at most this many
DEFAULT_REGISTER_THREADS = 16


def register_threads(cores: int, cap: int = DEFAULT_REGISTER_THREADS) -> int:
    """The largest power of two at most ``cores`` and ``cap`` (at least 1): torch takes only powers of two."""
    limit = max(1, min(cores, cap, MAX_REGISTER_THREADS))
    return 1 << (limit.bit_length() - 1)


def parse_pinned_alloc(text: str) -> tuple[str, int | None]:
    """(variant, register threads) of ``deepspeed``, ``exact``, ``register`` or ``register:N``; threads None where
    the variant has none or ``register`` named none. ValueError, one line, for anything else."""
    kind, _, threads = text.strip().lower().partition(":")
    if kind not in PINNED_ALLOCS:
        raise ValueError(f"unknown pinned allocation {text.strip()!r}; use one of deepspeed, register[:N], exact")
    if not threads:
        return kind, None
    n = int(threads) if kind == "register" and threads.isdigit() else 0
    if n < 1 or n > MAX_REGISTER_THREADS or n & (n - 1):
        raise ValueError(
            f"pinned allocation {text.strip()!r}: only register takes a thread count, a power of two from 1 to "
            f"{MAX_REGISTER_THREADS} (register:8)"
        )
    return kind, n


def pinned_alloc_text(text: str, cores: int) -> str:
    """``text`` as the probe's environment carries it: ``register`` with its thread count (``register_threads`` of
    ``cores`` where it named none), the others as named. ValueError as ``parse_pinned_alloc``."""
    kind, threads = parse_pinned_alloc(text)
    if kind != "register":
        return kind
    return f"register:{threads or register_threads(cores)}"


__all__ = [
    "DEFAULT_PINNED_ALLOC",
    "DEFAULT_REGISTER_THREADS",
    "MAX_REGISTER_THREADS",
    "PINNED_ALLOCS",
    "PINNED_ALLOC_ENV",
    "parse_pinned_alloc",
    "pinned_alloc_text",
    "register_threads",
]
