"""The GPU check's probe lines: per probe its config, status, fixed cost by phase (the engine's parts too), where the
rest of its time went, its timed window's spread, peaks (allocated, reserved, device-used), and the estimate's peak
per phase beside the measured one (uncalibrated: one trace of the study's shapes, as `tuner explain --study S --trial
N` reads it); the baseline's verdict; the pick. Exits 1 (after printing every line) when a probe's fixed cost passes
MAX_FIXED_S, fewer than MIN_PROBES probes measured, none ran out of memory (the space and cap are chosen so some do),
or no config is stable. The baseline refused before launching (their transformers fills WarmupLR's warmup 0, which
this DeepSpeed refuses) is said with DeepSpeed's reason: it is what their Trainer would do on this host.

    python3 benchmarks/gpu/probe_table.py STORAGE STUDY MAX_FIXED_S [MIN_PROBES]
"""

from __future__ import annotations

import sys
from typing import Any

from trials.contract import Knobs
from tuner.interop.export.changes import best_changes
from tuner.memory.estimator import Estimator
from tuner.memory.explain import phase_checks
from tuner.records.probe import ProbeRow
from tuner.search.selection import baseline_row, best_stable
from tuner.session.explain_trial import trial_inputs
from tuner.storage import Store

MiB = 2**20


def mib(value: int | None) -> str:
    return "-" if value is None else f"{value / MiB:,.0f}"


def _config(k: dict[str, Any]) -> str:
    return (
        f"micro {k['micro_batch_size']} ZeRO-{k['zero_stage']}{' offload' if k.get('offload_optimizer') else ''}"
        f"{' overlap' if k.get('overlap_comm') else ''}{' ckpt' if k.get('gradient_checkpointing') else ''}"
    )


def _times(res: dict[str, Any]) -> str:
    """The fixed cost by phase, and where the time after the first step went."""
    setup = res.get("setup_phases") or {}
    parts = ", ".join(f"{name} {secs:.1f}" for name, secs in setup.items() if not name.endswith("_gib"))
    pinned = setup.get("engine.pinned_gib")
    run = ", ".join(f"{name} {secs:.1f}" for name, secs in (res.get("run_phases") or {}).items())
    steps = res.get("steps") or {}
    spread = steps.get("spread")
    timed = f"; {steps.get('cycles', 0)} timed cycles, spread {spread:.1%}" if spread is not None else ""
    return f"[{parts}{f', pinned {pinned:.1f} GiB' if pinned else ''}] then [{run}]{timed}"


def _estimates(est: Estimator | None, r: ProbeRow) -> str:
    """The estimate's peak per phase beside the measured one (each measured phase; the estimated peak where the probe
    measured none, an OOM)."""
    if est is None:
        return "estimate: none (no trace)"
    try:
        breakdown = est.predict(Knobs.model_validate(r.knobs)).breakdown
    except (ValueError, KeyError) as exc:
        return f"estimate: none ({exc})"
    if breakdown is None:
        return "estimate: none"
    checks = phase_checks(breakdown.worst, r.measurement.phase_peaks)
    if not checks:
        return f"estimate: peak {mib(breakdown.peak)} MiB ({breakdown.worst.peak.title}), measured no phase"
    said = [f"{c.phase} {mib(c.estimate.total)} / {mib(c.measured)} MiB ({c.error:+.1%})" for c in checks]
    return "estimate / measured allocated: " + ", ".join(said)


def _estimator(store: Store, study: str, rows: list[ProbeRow]) -> Estimator | None:
    """One trace of the study's shapes (the baseline's, the others measured), uncalibrated."""
    first = baseline_row(rows) or next(iter(rows), None)
    if first is None or first.trial_number is None:
        return None
    try:
        est = trial_inputs(store, study, first.trial_number).inputs.estimator
    except Exception as exc:  # a trace that could not run is said in the lines, not a failed check
        print(f"estimate: not traced ({type(exc).__name__}: {exc})")
        return None
    return Estimator(trace=est.trace, world_size=est.world_size, global_batch=est.global_batch)


def main() -> int:
    storage, study, max_fixed = sys.argv[1], sys.argv[2], float(sys.argv[3])
    min_probes = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    store = Store(storage)
    rows = [r for r in store.probes(study) if r.measured]
    est = _estimator(store, study, rows)
    failed = []
    for r in rows:
        k, res = r.knobs, r.result or {}
        trial = "-" if r.trial_number is None else r.trial_number
        used = max((rank.get("device_used_peak") or 0 for rank in res.get("ranks") or []), default=0)
        print(
            f"probe {trial} ({r.fidelity}): {_config(k)}: {r.status}, fixed cost {r.setup_s or 0:.1f} s "
            f"{_times(res)}, peak allocated {mib(r.peak_allocated)} / reserved {mib(r.peak_reserved)} / device-used "
            f"{mib(used)} MiB, need {mib(r.memory_need)} of {mib(r.capacity)} MiB; {_estimates(est, r)}"
        )
        if r.setup_s is not None and r.setup_s > max_fixed:
            failed.append(f"probe {r.trial_number}'s fixed cost {r.setup_s:.1f} s > {max_fixed:g} s ({_config(k)})")
    everything = store.probes(study)
    best = best_stable(everything)
    base = baseline_row(rows) or baseline_row(everything)  # a refused baseline measured nothing
    said = "not probed" if base is None else f"{base.status}" + (f" ({base.cause})" if base.status == "refused" else "")
    print(f"baseline: {said} ({len(rows)} probes measured)")
    if best is None:
        failed.append("no stable config")
    else:
        verdict = best_changes(best, store.study_definition(study) or {}, base).verdict
        print(f"pick: trial {best.trial_number}, {best.samples_per_s:.3g} samples/s; {verdict or 'no verdict'}")
    if base is None:
        failed.append("the team's config (trial 0) was not probed")
    if len(rows) < min_probes:
        failed.append(f"{len(rows)} probes measured in the budget, fewer than {min_probes}")
    if not any(r.status == "oom" for r in rows):
        failed.append("no probe ran out of memory: the check's space and cap are chosen so some do")
    for line in failed:
        print(f"GPU CHECK FAIL: {line}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
