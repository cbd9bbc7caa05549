"""The GPU check's probe lines: per probe its config, status, fixed cost and peaks (allocated, reserved, device-used);
the baseline's verdict; the pick. Exits 1 when a probe's fixed cost passes MAX_FIXED_S or no config is stable.

    python3 benchmarks/gpu/probe_table.py STORAGE STUDY MAX_FIXED_S
"""

from __future__ import annotations

import sys

from tuner.interop.export.changes import best_changes
from tuner.search.selection import baseline_row, best_stable
from tuner.storage import Store

MiB = 2**20


def mib(value: int | None) -> str:
    return "-" if value is None else f"{value / MiB:,.0f}"


def main() -> int:
    storage, study, max_fixed = sys.argv[1], sys.argv[2], float(sys.argv[3])
    store = Store(storage)
    rows = [r for r in store.probes(study) if r.measured]
    failed = []
    for r in rows:
        k, res = r.knobs, r.result or {}
        trial = "-" if r.trial_number is None else r.trial_number
        used = max((rank.get("device_used_peak") or 0 for rank in res.get("ranks") or []), default=0)
        config = (
            f"micro {k['micro_batch_size']} ZeRO-{k['zero_stage']}{' offload' if k.get('offload_optimizer') else ''}"
            f"{' overlap' if k.get('overlap_comm') else ''}{' ckpt' if k.get('gradient_checkpointing') else ''}"
        )
        print(
            f"probe {trial} ({r.fidelity}): {config}: {r.status}, fixed cost {r.setup_s or 0:.1f} s, peak "
            f"allocated {mib(r.peak_allocated)} / reserved {mib(r.peak_reserved)} / device-used {mib(used)} MiB, "
            f"need {mib(r.memory_need)} of {mib(r.capacity)} MiB"
        )
        if r.setup_s is not None and r.setup_s > max_fixed:
            failed.append(f"probe {r.trial_number}'s fixed cost {r.setup_s:.1f} s > {max_fixed:g} s")
    best = best_stable(store.probes(study))
    base = baseline_row(rows)
    print(f"baseline: {'not probed' if base is None else base.status} ({len(rows)} probes measured)")
    if best is None:
        failed.append("no stable config")
    else:
        verdict = best_changes(best, store.study_definition(study) or {}, base).verdict
        print(f"pick: trial {best.trial_number}, {best.samples_per_s:.3g} samples/s; {verdict or 'no verdict'}")
    if base is None:
        failed.append("the team's config (trial 0) was not probed")
    for line in failed:
        print(f"GPU CHECK FAIL: {line}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
