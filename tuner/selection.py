"""Which config to hand the user: pure functions over stored probe rows (see tuner.storage.schema.probes)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Iterable

MEASURED = ("baseline", "short", "confirm")


def is_stable(status: str, peak: int | None, capacity: int | None, headroom: float, alloc_retries: int | None) -> bool:
    """Finished, peak at most ``headroom`` x capacity, and no allocator retries (a sign of fragmentation)."""
    if status != "ok" or peak is None:
        return False
    if capacity is not None and peak > headroom * capacity:
        return False
    return not alloc_retries


@dataclass(frozen=True)
class Candidate:
    config_key: str
    knobs: dict[str, Any]
    config: dict[str, Any]
    objective: float  # conservative: the lower of median and (mean - 1 std) over its measurements
    samples_per_s: float
    peak_allocated: int
    capacity: int | None
    confirmed: bool
    measurements: int
    trial_number: int | None
    rows: list[dict[str, Any]] = field(default_factory=list, repr=False)


def candidates(rows: Iterable[dict[str, Any]]) -> list[Candidate]:
    """Stable configs, one per config key, best first. A config with any unstable measurement is excluded."""
    by_key: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        if row.get("fidelity") in MEASURED:
            by_key.setdefault(row["config_key"], []).append(row)
    out: list[Candidate] = []
    for key, group in by_key.items():
        if not all(r.get("stable") for r in group):
            continue
        objs = [float(r["objective"]) for r in group if r.get("objective") is not None]
        if not objs:
            continue
        lcb = statistics.median(objs)
        if len(objs) > 1:
            lcb = min(lcb, statistics.fmean(objs) - statistics.stdev(objs))
        confirmed = any(r.get("fidelity") == "confirm" for r in group)
        first = min(group, key=lambda r: r.get("id") or 0)
        out.append(
            Candidate(
                config_key=key,
                knobs=dict(first["knobs"]),
                config=dict(first["config"]),
                objective=lcb,
                samples_per_s=statistics.median(float(r["samples_per_s"] or 0.0) for r in group),
                peak_allocated=max(int(r["peak_allocated"] or 0) for r in group),
                capacity=first.get("capacity"),
                confirmed=confirmed,
                measurements=len(objs),
                trial_number=first.get("trial_number"),
                rows=group,
            )
        )
    out.sort(key=lambda c: (c.confirmed, c.objective), reverse=True)
    return out


def best_stable(rows: Iterable[dict[str, Any]]) -> Candidate | None:
    """The best stable config: confirmed ones (re-probed longer) win over unconfirmed; then the higher objective."""
    found = candidates(rows)
    return found[0] if found else None
