"""Wall-clock budgets ("90s", "30m", "2h", "1h30m") and memory sizes ("160MiB", "2GiB", "80GB"). Pure, no torch."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tuner.errors import BudgetError, ConfigError

_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?")
_SIZE = re.compile(r"(\d+(?:\.\d+)?(?:e\d+)?)\s*([KMGT]i?B|B)?", re.IGNORECASE)
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
    """Bytes in a memory size: 160MiB, 2GiB, 80GB, 1.5GiB or a plain byte count."""
    if isinstance(text, int):
        value = text
    else:
        m = _SIZE.fullmatch(text.strip())
        if m is None:
            raise ConfigError(f"memory size {text!r} is not understood; write it like 160MiB, 2GiB or 80GB")
        unit = (m.group(2) or "b").lower()
        value = int(float(m.group(1)) * _UNITS[unit])
    if value <= 0:
        raise ConfigError(f"memory size {text!r} must be positive; write it like 160MiB, 2GiB or 80GB")
    return value


def format_size(n: int | float | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


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
