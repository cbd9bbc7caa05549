"""The facts in PyTorch's CUDA out-of-memory message, read back (pure).

PyTorch writes (torch/csrc/.../CUDACachingAllocator.cpp)::

    CUDA out of memory. Tried to allocate 4.81 GiB. GPU 0 has a total capacity of 79.15 GiB of which 2.86 GiB is
    free. Process 1234 has 76.28 GiB memory in use. Of the allocated memory 74.19 GiB is allocated by PyTorch, and
    1.59 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True ...

Users paste it folded, abbreviated ("..."), or with other lines around it; each fact is read where it is found and
left None where it is not. A text with no "Tried to allocate" is not an OOM message (a ConfigError saying so).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tuner.bounded import read_text_file
from tuner.errors import ConfigError

_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
#: a number starts where no digit or dot precedes it and holds at most 20 digits each side of its point: each start
#: is tried in a bounded number of steps (``[0-9]+`` retried from every digit of a 100,000-digit run was quadratic,
#: ~500 s), and a 1<309 zeros> GiB is no size at all (it was an OverflowError)
_SIZE = r"(?<![0-9.])([0-9]{1,20}(?:\.[0-9]{1,20})?)\s{0,8}(B|KiB|MiB|GiB|TiB)"
#: a pasted message is a few lines; a text over this is not one (it is refused before any pattern is searched)
MAX_TEXT = 64 << 10
_PATTERNS = {
    "failed": rf"Tried to allocate {_SIZE}",
    "capacity": rf"total capacity of {_SIZE}",
    "free": rf"of which {_SIZE} is free",
    "allocated": rf"{_SIZE} is allocated by PyTorch",
    "reserved_unallocated": rf"{_SIZE} is reserved by PyTorch but unallocated",
}


@dataclass(frozen=True)
class OomMessage:
    """The sizes the message states, in bytes (None: not in the text as given)."""

    failed: int
    capacity: int | None = None
    free: int | None = None
    allocated: int | None = None
    reserved_unallocated: int | None = None

    def lines(self) -> list[str]:
        """The facts as read, in the message's own units (GiB with two decimals)."""
        facts = [f"tried to allocate {_gib(self.failed)}"]
        for label, value in (
            ("capacity", self.capacity),
            ("free", self.free),
            ("allocated by PyTorch", self.allocated),
            ("reserved but unallocated", self.reserved_unallocated),
        ):
            if value is not None:
                facts.append(f"{label} {_gib(value)}")
        return facts


def _gib(n: float) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


def _size(number: str, unit: str) -> int:
    return int(float(number) * _UNITS[unit])


def parse(text: str) -> OomMessage:
    """The message's facts; a ConfigError when the text has no "Tried to allocate <size>" (not an OOM message)."""
    if len(text) > MAX_TEXT:
        raise ConfigError(
            f"--oom-message: the text is over {MAX_TEXT >> 10} KiB; paste PyTorch's out-of-memory message alone"
        )
    flat = " ".join(text.split())
    found: dict[str, int] = {}
    for name, pattern in _PATTERNS.items():
        m = re.search(pattern, flat)
        if m is not None:
            found[name] = _size(m.group(1), m.group(2))
    if "failed" not in found:
        raise ConfigError(
            "--oom-message: no 'Tried to allocate <size>' in the text; paste PyTorch's CUDA out-of-memory message"
        )
    return OomMessage(**found)


def read(value: str) -> OomMessage:
    """``--oom-message``: the text itself, or ``@path`` to a file holding it."""
    if value.startswith("@"):  # a regular file, read no further than MAX_TEXT (no /dev/zero, no FIFO)
        value = read_text_file(Path(value[1:]), "--oom-message file", limit=MAX_TEXT)
    return parse(value)


def fragmentation(msg: OomMessage) -> tuple[bool | None, str]:
    """Whether fragmentation can explain the failure: the allocator's reserved-but-unallocated memory plus the free
    memory would hold the failed block if it were contiguous (then expandable_segments can help); when even both
    together are smaller than the block, the memory is simply not there and fragmentation is ruled out. None: the
    message as given does not say."""
    if msg.reserved_unallocated is None:
        return None, "fragmentation: the message as given does not state the reserved-but-unallocated memory"
    spare = msg.reserved_unallocated + (msg.free or 0)
    held = f"{_gib(msg.reserved_unallocated)} reserved-unallocated" + (
        f" + {_gib(msg.free)} free" if msg.free is not None else ""
    )
    if spare < msg.failed:
        return False, (
            f"fragmentation ruled out: {held} = {_gib(spare)} < the {_gib(msg.failed)} asked for; even in one "
            "piece it would not fit (expandable_segments cannot help)"
        )
    return True, (
        f"fragmentation possible: {held} = {_gib(spare)} >= the {_gib(msg.failed)} asked for, yet no block that "
        "large was free (try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)"
    )
