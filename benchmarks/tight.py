"""Tight variants of a recorded table: the same probes on a smaller device, derived without probing again.

The emulated device's peaks are exact to the byte and do not depend on its size (it only refuses an allocation that
would pass the capacity), so a table recorded at one device memory says what every config does at a smaller one
``B``, repeat by repeat:

- a repeat that finished with its peak <= ``B`` still finishes, with the same speed and peak; the stability rule then
  judges it against the new line (peak <= headroom x ``B``), so peaks between headroom x ``B`` and ``B`` finish above
  the headroom (measured, not shippable);
- a repeat that finished with a peak above ``B`` runs out of memory. It is charged its setup seconds plus
  ``OOM_MEASURE_FRACTION`` of its measuring seconds: across the recorded tables, an OOM probe's measuring part took a
  median 0.10-0.26 of a finished probe's (it dies in the first micro-steps), so 0.25 is the expensive end. Its result
  says what an OOM on a CUDA device says: status "oom", the capacity, no refused size (``oom_need`` None), so the
  search learns only "needs more than ``B``";
- a repeat that already ran out of memory at the recorded size still does, charged its recorded seconds; its refused
  size is dropped as well (at a smaller device it would have been refused earlier, at a smaller size).

``B`` is a quantile of the table's peaks: the per-config peak (the largest over its repeats and ranks) of every
config whose repeats all finished.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from benchmarks.table import Table

OOM_MEASURE_FRACTION = 0.25  # an OOM probe's measuring seconds, as a fraction of the same config's finished probe
VARIANTS: dict[str, float | None] = {"full": None, "q60": 0.60, "q35": 0.35}  # name -> quantile of the peaks


def repeat_peak(rep: dict[str, Any]) -> int:
    """The largest peak of a repeat over its ranks (bytes)."""
    ranks = (rep.get("result") or {}).get("ranks") or []
    return max([int(rep.get("peak_allocated") or 0), *(int(r.get("peak_allocated") or 0) for r in ranks)])


def config_peaks(raw: dict[str, Any]) -> list[int]:
    """Per config whose every repeat finished: its largest peak."""
    return [
        max(repeat_peak(rep) for rep in row["repeats"])
        for row in raw["rows"]
        if row["repeats"] and all(rep["status"] == "ok" for rep in row["repeats"])
    ]


def quantile(values: Sequence[int], q: float) -> int:
    """The ``q`` quantile of ``values``, linear between order statistics (numpy's default)."""
    if not values:
        raise ValueError("no finished config to take a quantile of")
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return round(s[lo] + (s[hi] - s[lo]) * (pos - lo))


def tighten(raw: dict[str, Any], device_memory: int) -> dict[str, Any]:
    """The recorded table ``raw`` as if recorded on a device of ``device_memory`` bytes per rank (see the module)."""
    if device_memory > int(raw["device_memory"]):
        raise ValueError("a tight variant cannot have more device memory than the recording")
    out = copy.deepcopy(raw)
    out["device_memory"] = device_memory
    out["tight"] = {"recorded_device_memory": raw["device_memory"], "oom_measure_fraction": OOM_MEASURE_FRACTION}
    for row in out["rows"]:
        row["repeats"] = [_tighten_repeat(rep, device_memory) for rep in row["repeats"]]
    return out


def _tighten_repeat(rep: dict[str, Any], cap: int) -> dict[str, Any]:
    rep = dict(rep)
    result = dict(rep.get("result") or {})
    ranks = [dict(r) for r in result.get("ranks") or []]
    status = rep["status"]
    if status == "ok" and repeat_peak(rep) > cap:
        setup = float(rep.get("setup_s") or 0.0)
        seconds = setup + OOM_MEASURE_FRACTION * max(float(rep["probe_seconds"]) - setup, 0.0)
        cause = f"OutOfMemoryError: device of {cap / 2**20:.2f} MiB (tight variant; recorded peak {repeat_peak(rep)})"
        status = "oom"
        rep.update(status="oom", cause=cause, samples_per_s=None, probe_seconds=seconds)
        result.update(status="oom", cause=cause, samples_per_s=None, tokens_per_s=None, steps=None, wall_s=seconds)
    if status == "oom":
        for r in ranks:
            r["peak_allocated"] = min(int(r.get("peak_allocated") or 0), cap)
            r["peak_reserved"] = min(int(r.get("peak_reserved") or 0), cap)
            r["oom_need"] = None
        rep["peak_allocated"] = min(int(rep.get("peak_allocated") or 0), cap)
    for r in ranks:
        r["capacity"] = cap
    rep["capacity"] = cap
    result.update(capacity=cap, ranks=ranks)
    rep["result"] = result
    return rep


def variant(table: Table, name: str, truth: str = "median") -> Table:
    """``table`` under the variant ``name`` of ``VARIANTS`` ("full": the recording itself)."""
    q = VARIANTS[name]
    if q is None:
        return table
    cap = quantile(config_peaks(table.raw), q)
    return Table.from_raw(tighten(table.raw, cap), f"{table.name}@{name}", truth)
