"""The GPU check's probe lines: per probe its config, status, fixed cost by phase (the engine's parts too, and how it
pinned host memory), where the rest of its time went, its timed window's spread, peaks (allocated, reserved,
device-used), and the estimate's peak per phase beside the measured one (uncalibrated: one trace of the study's
shapes, as `tuner explain --study S --trial N` reads it, from the first probe with measured ranks: a baseline refused
before launching, as on a host whose transformers fills WarmupLR's warmup 0, measured nothing); the baseline's
verdict; the pick. Then its checks, each naming its figure and target (benchmarks.gpu.verdict): every launched
probe's fixed cost at most MAX_FIXED_S, at least MIN_PROBES probes launched (a refused one is not counted), some
probe out of memory (the space and cap are chosen so some do), a stable config, the team's config probed. Exit 1
when a check failed.

    python3 -m benchmarks.gpu.probe_table STORAGE STUDY MAX_FIXED_S [MIN_PROBES] [--no-estimate] [--no-checks]

``--no-estimate``: no trace (a flan-t5-large trace takes minutes of CPU: the check runs this among its steps and the
estimate column beside them, off the GPU's clock); ``--no-checks``: the lines alone, exit 0.
"""

from __future__ import annotations

import sys
from typing import Any

from benchmarks.gpu.facts import launched
from benchmarks.gpu.verdict import Check, report
from trials.contract import Knobs, Status
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
    variant = next((r.get("fingerprint", {}).get("pinned_alloc") for r in res.get("ranks") or []), None)
    parts += f", pinned by {variant}" if variant and setup.get("engine.pinned_gib") else ""
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


def estimate_source(rows: list[ProbeRow]) -> ProbeRow | None:
    """The probe whose shapes the estimate column traces: the first with measured ranks (the baseline where it ran;
    a baseline refused before launching measured nothing)."""
    return next((r for r in rows if r.trial_number is not None and r.measurement.ranks), None)


def _estimator(store: Store, study: str, rows: list[ProbeRow]) -> Estimator | None:
    """One trace of the study's shapes (``estimate_source``), uncalibrated."""
    first = estimate_source(rows)
    if first is None or first.trial_number is None:
        return None
    try:
        est = trial_inputs(store, study, first.trial_number).inputs.estimator
    except Exception as exc:  # a trace that could not run is said in the lines, not a failed check
        print(f"estimate: not traced ({type(exc).__name__}: {exc})")
        return None
    return Estimator(trace=est.trace, world_size=est.world_size, global_batch=est.global_batch)


def _line(r: ProbeRow, est: Estimator | None) -> str:
    k, res = r.knobs, r.result or {}
    trial = "-" if r.trial_number is None else r.trial_number
    used = max((rank.get("device_used_peak") or 0 for rank in res.get("ranks") or []), default=0)
    estimate = _estimates(est, r) if est is not None else "estimate: after the GPU steps (--no-estimate)"
    return (
        f"probe {trial} ({r.fidelity}): {_config(k)}: {r.status}, fixed cost {r.setup_s or 0:.1f} s "
        f"{_times(res)}, peak allocated {mib(r.peak_allocated)} / reserved {mib(r.peak_reserved)} / device-used "
        f"{mib(used)} MiB, need {mib(r.memory_need)} of {mib(r.capacity)} MiB; {estimate}"
    )


def checks(rows: list[ProbeRow], everything: list[ProbeRow], max_fixed: float, min_probes: int) -> list[Check]:
    """The table's checks (pure): fixed cost, probes launched, an OOM among them, a stable pick, the baseline."""
    ran = launched(rows)
    refused = len([r for r in rows if r.status == Status.REFUSED])
    timed = [r for r in ran if r.setup_s is not None]
    slowest = max(timed, key=lambda r: r.setup_s or 0.0, default=None)
    fixed = "none measured" if slowest is None else f"max {slowest.setup_s:.1f} s (probe {slowest.trial_number})"
    over = [r for r in timed if (r.setup_s or 0.0) > max_fixed]
    fixed += "".join(f"; probe {r.trial_number} {r.setup_s:.1f} s ({_config(r.knobs)})" for r in over)
    oom = sum(r.status == Status.OOM for r in ran)
    base, pick = baseline_row(everything), best_stable(everything)
    return [
        Check("fixed cost of every launched probe", fixed, f"<= {max_fixed:g} s", slowest is not None and not over),
        Check(
            "probes launched in the budget",
            f"{len(ran)}" + (f" ({refused} refused before launching, not counted)" if refused else ""),
            f">= {min_probes}",
            len(ran) >= min_probes,
        ),
        Check("probes out of memory", f"{oom} of {len(ran)}", ">= 1 (the space and cap are chosen so)", oom >= 1),
        Check("stable configs", "none" if pick is None else f"trial {pick.trial_number}", "a pick", pick is not None),
        Check("the team's config (trial 0)", "not probed" if base is None else str(base.status), "probed", bool(base)),
    ]


def main() -> int:
    args = [a for a in sys.argv[1:] if a not in ("--no-estimate", "--no-checks")]
    storage, study, max_fixed = args[0], args[1], float(args[2])
    min_probes = int(args[3]) if len(args) > 3 else 1
    store = Store(storage)
    everything = store.probes(study)
    rows = [r for r in everything if r.measured]
    est = None if "--no-estimate" in sys.argv else _estimator(store, study, rows)
    for r in rows:
        print(_line(r, est))
    best = best_stable(everything)
    base = baseline_row(everything)
    said = "not probed" if base is None else f"{base.status}" + (f" ({base.cause})" if base.status == "refused" else "")
    print(f"baseline: {said} ({len(launched(rows))} probes launched)")
    if best is not None:
        verdict = best_changes(best, store.study_definition(study) or {}, base).verdict
        print(f"pick: trial {best.trial_number}, {best.samples_per_s:.3g} samples/s; {verdict or 'no verdict'}")
    if "--no-checks" in sys.argv:  # the estimate column alone (the checks were said without it)
        return 0
    return report(checks(rows, everything, max_fixed, min_probes))


if __name__ == "__main__":
    sys.exit(main())
