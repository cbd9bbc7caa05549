"""One `tuner doctor` finding (a typed record), the order findings are told in, and the findings whose texts take
no values from the setup (doctor_findings.yaml)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

import yaml

Severity = Literal["warn", "info"]


@dataclass(frozen=True)
class Finding:
    code: str
    severity: Severity
    title: str
    why: str
    fix: str  # what to try by hand
    search: str  # how `tuner search` tests it: the space lines to add (knob names of trials.contract.Knobs)
    nbytes: int | None = None  # the bytes at stake on one rank, from the one estimate: what findings are ranked by
    number: str = ""  # that number in words (the estimate's part, its phase, what the fix leaves), or why none
    not_covered: str = ""  # what the number does not cover (besides the estimate's own NOT_COVERED)
    oom: str = ""  # what the user's OOM message says about this finding (--oom-message; empty without one)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def rank(findings: Iterable[Finding]) -> list[Finding]:
    """Largest number first; the findings without one after them, warnings before notes; otherwise as found."""
    return sorted(findings, key=lambda f: (f.nbytes is None, -(f.nbytes or 0), f.severity != "warn"))


def when(condition: bool, finding: Finding) -> list[Finding]:
    """``[finding]`` when ``condition`` holds, else none: the shape of every check with fixed texts."""
    return [finding] if condition else []


FIXED_FILE = Path(__file__).with_name("doctor_findings.yaml")


def fixed(code: str) -> Finding:
    """The finding ``code`` whose texts take no values from the setup (:data:`FIXED_FILE`)."""
    return _fixed()[code]


@cache
def _fixed() -> dict[str, Finding]:
    entries = yaml.safe_load(FIXED_FILE.read_text(encoding="utf-8"))
    return {code: Finding(code=code, **entry) for code, entry in entries.items()}
