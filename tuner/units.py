"""Wall-clock budgets ("90s", "30m", "2h", "1h30m") and memory sizes ("160MiB", "2GiB", "80GB"). Pure, no torch."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal

from tuner.errors import BudgetError, ConfigError, LimitError

_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?")
_SIZE = re.compile(r"(\d+(?:\.\d+)?(?:e\d+)?)\s*([KMGT]i?B|B)?", re.IGNORECASE)
MAX_SIZE = 2**50  # 1 PiB: above any device's memory per rank; larger is a typo or an attack (1e400 is infinity)
_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_duration(text: str) -> float:
    """Seconds in a budget string: 90s, 30m, 2h, 1h30m, 1h30m15s (a bare number means seconds)."""
    raw = text.strip().lower().replace(" ", "")
    if re.fullmatch(r"\d+(?:\.\d+)?", raw):
        seconds = float(raw)
    else:
        m = _DURATION.fullmatch(raw)
        if not raw or m is None or not any(m.groups()):
            raise BudgetError(f"budget {text!r} is not a duration; write it like 90s, 30m, 2h or 1h30m")
        h, mi, s = (float(g) if g else 0.0 for g in m.groups())
        seconds = h * 3600 + mi * 60 + s
    if seconds <= 0:
        raise BudgetError(f"budget {text!r} is zero; give a positive duration like 90s, 30m or 2h")
    return seconds


def format_duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    if h:
        return f"{h}h{m:02d}m"
    if m:
        return f"{m}m{s:02d}s"
    return f"{s}s"


def parse_size(text: str | int) -> int:
    """Bytes in a memory size: 160MiB, 2GiB, 80GB, 79.15GiB or a plain byte count, from 1 to MAX_SIZE, computed
    exactly (no float: "1e400" is not infinity here, it is too large). A fractional size in a unit above a byte
    (79.15GiB, the figure in a PyTorch OOM message) is rounded down to whole bytes; a bare byte count must be whole."""
    if isinstance(text, bool):
        raise ConfigError(f"memory size {text!r} is not a size; write it like 160MiB, 2GiB or 80GB")
    unit = "b"
    if isinstance(text, int):
        value = Decimal(text)
    else:
        m = _SIZE.fullmatch(text.strip())
        if m is None:
            raise ConfigError(f"memory size {text!r} is not understood; write it like 160MiB, 2GiB or 80GB")
        unit = (m.group(2) or "b").lower()
        try:
            value = Decimal(m.group(1)) * _UNITS[unit]
        except ArithmeticError:  # an exponent past Decimal's own range: decimal.Overflow
            value = Decimal(MAX_SIZE + 1)
    if value <= 0:
        raise ConfigError(f"memory size {text!r} must be positive; write it like 160MiB, 2GiB or 80GB")
    if value > MAX_SIZE:
        raise LimitError(f"memory size {text!r} is above 1 PiB per rank; write it like 80GiB")
    whole = int(value)  # rounds toward zero: a positive size rounds down
    if unit == "b" and whole != value:
        raise LimitError(f"memory size {text!r} is not a whole number of bytes; write it like 160MiB or 2GiB")
    if whole < 1:
        raise LimitError(f"memory size {text!r} is under one byte; write it like 160MiB or 2GiB")
    return whole


def parse_memory(text: str | int) -> int:
    """Bytes of a device's memory: a size with its unit (160MiB, 80GiB, 80GB; a whole number given as a number is
    bytes). Text without a unit is refused: `80` is 80 bytes to a parser and 80 GB to the person who typed it."""
    m = _SIZE.fullmatch(text.strip()) if isinstance(text, str) else None
    if m is not None and not m[2]:
        raise ConfigError(f"memory size {text!r} has no unit; write it like 160MiB, 80GiB or 80GB")
    return parse_size(text)


def format_size(n: int | float | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def memory_text(n: int | float) -> str:
    """A memory size as the CUDA OOM message writes it: GiB with two decimals, MiB below one GiB (a tiny model's
    numbers are never "0.04 GiB")."""
    return f"{n / (1 << 30):.2f} GiB" if abs(n) >= 1 << 30 else f"{n / (1 << 20):,.2f} MiB"


@dataclass
class Deadline:
    """The search's wall clock. ``clock`` is injectable so replays can run on simulated time."""

    seconds: float
    clock: Callable[[], float] = time.monotonic
    start: float = field(default=0.0)

    def __post_init__(self) -> None:
        self.start = self.clock()

    @property
    def left(self) -> float:
        return max(0.0, self.start + self.seconds - self.clock())

    @property
    def elapsed(self) -> float:
        return self.clock() - self.start

    def expired(self) -> bool:
        return self.left <= 0.0
