"""The GPU check's assertions, each one line naming its figure and its target (stdlib only):

check <what>: <figure>, target <target>: ok | FAIL
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Check:
    what: str
    figure: str
    target: str
    ok: bool

    def line(self) -> str:
        return f"check {self.what}: {self.figure}, target {self.target}: {'ok' if self.ok else 'FAIL'}"


def report(checks: list[Check]) -> int:
    """Prints each check's line; 1 when any failed."""
    for c in checks:
        print(c.line())
    return 0 if all(c.ok for c in checks) else 1


__all__ = ["Check", "report"]
