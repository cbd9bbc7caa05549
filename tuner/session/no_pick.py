"""Why a study has no stable config yet, and the fix, read from its probes: the line `tuner search` ends with, and
the tail of `tuner best` / ``GET /best-config``'s "no stable config" answer.

"Give more device memory" is the fix for probes that ran out of it, not for probes the engine refused (T5's shared
embedding under FSDP2: no amount of memory runs it) nor for probes that crashed: each reason gets its own fix, a
refusal's in its own words (a refusal names what to do). Pure."""

from __future__ import annotations

from collections.abc import Iterable

from tuner.records import ProbeRow, ProbeStatus
from tuner.records.probe import refusal_reason

MAX_CAUSES = 3  # distinct causes quoted (`tuner trials --all` lists every one)
CAUSE_CHARS = 300  # an error's cause quoted up to this (a refusal's whole)


def _distinct(rows: Iterable[ProbeRow], limit: int | None) -> list[str]:
    seen: list[str] = []
    for row in rows:
        text = refusal_reason(row.cause or row.status.value)
        if limit is not None and len(text) > limit:
            text = text[: limit - 1] + "\u2026"
        if text not in seen:
            seen.append(text)
    return seen[:MAX_CAUSES]


def why_no_pick(rows: Iterable[ProbeRow]) -> str:
    """What kept every probe that ran from a stable config, with the fix for each reason, most telling first."""
    ran = [r for r in rows if r.measured]
    if not ran:
        return "no probe has run yet: run `tuner search` (longer, or with a larger --budget)"
    by = {s: [r for r in ran if r.status == s] for s in ProbeStatus}
    parts: list[str] = []
    refused = by[ProbeStatus.REFUSED]
    if refused:
        n = len(refused)
        every = "every probe was" if n == len(ran) else f"{n} probe{' was' if n == 1 else 's were'}"
        parts.append(f"{every} refused before running: " + "; ".join(_distinct(refused, None)))
    if by[ProbeStatus.OK]:
        parts.append(
            f"{len(by[ProbeStatus.OK])} ran but above the memory headroom: give a larger --device-memory (if your "
            "card has it) or search smaller micro batches, a higher ZeRO stage, offload or gradient checkpointing"
        )
    elif by[ProbeStatus.OOM]:
        parts.append(
            f"{len(by[ProbeStatus.OOM])} ran out of device memory: give a larger --device-memory (if your card has "
            "it) or search smaller micro batches, a higher ZeRO stage, offload or gradient checkpointing"
        )
    failed = [r for r in ran if r.status not in (ProbeStatus.OK, ProbeStatus.OOM, ProbeStatus.REFUSED)]
    if failed:
        parts.append(
            f"{len(failed)} failed ({'; '.join(_distinct(failed, CAUSE_CHARS))}); `tuner trials --all` lists each"
        )
    return "; ".join(parts)


__all__ = ["why_no_pick"]
