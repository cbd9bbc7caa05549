"""Replays search strategies against recorded probe tables: one command, deterministic for given seeds.

    .venv/bin/python -m benchmarks.replay benchmarks/tables/*.json --seeds 20

A probe is a table lookup (a recorded repeat drawn by the seed, charged its recorded seconds). Per strategy and table,
medians over the seeds of:

- ``to 1%``: probe-seconds until the strategy's pick is within 1% of the table's best stable objective (and as a
  percentage of the full grid's probe-seconds); "never" when the median run never gets there;
- ``@10% @20% @50%``: the fraction of the best its pick reaches after 10/20/50% of the grid's probe-seconds;
- ``final``: the fraction its final pick reaches; ``unstable``: runs whose final pick is unstable in the table (OOMs
  or peaks above the headroom on some repeat: a config that would crash the user's training);
- ``probes``, ``seconds``: probes run and probe-seconds spent until the strategy stopped.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.table import Env, Table
from trials.contract import Knobs

CHECKPOINTS = (0.10, 0.20, 0.50)
BUDGET_FACTOR = 1.5  # every run may spend 1.5x the grid's probe-seconds (the grid itself draws noisy repeats)


@dataclass
class RunStats:
    seconds_to_1pct: float | None
    seconds_to_5pct: float | None
    at: dict[float, float]
    final: float
    unstable: bool
    probes: int
    seconds: float


def run_one(table: Table, strategy: Callable[[Env], None], seed: int) -> RunStats:
    env = Env(table=table, seed=seed, budget_s=BUDGET_FACTOR * table.grid_seconds)
    strategy(env)
    final_key = env.final_pick()
    grid_s = table.grid_seconds
    return RunStats(
        seconds_to_1pct=env.seconds_to(0.99),
        seconds_to_5pct=env.seconds_to(0.95),
        at={c: env.value_at(c * grid_s) for c in CHECKPOINTS},
        final=env.value_at(math.inf),
        unstable=final_key is not None and not table.entries[final_key].stable,
        probes=len(env.probes),
        seconds=env.clock,
    )


def summarize(table: Table, runs: list[RunStats]) -> dict[str, Any]:
    reached = [r.seconds_to_1pct if r.seconds_to_1pct is not None else math.inf for r in runs]
    med = statistics.median(reached)
    med5 = statistics.median(r.seconds_to_5pct if r.seconds_to_5pct is not None else math.inf for r in runs)
    return {
        "to_5pct_frac": None if math.isinf(med5) else med5 / table.grid_seconds,
        "to_1pct_s": None if math.isinf(med) else med,
        "to_1pct_frac": None if math.isinf(med) else med / table.grid_seconds,
        "reached_1pct_runs": sum(1 for r in runs if r.seconds_to_1pct is not None),
        "at": {f"{int(c * 100)}%": statistics.median(r.at[c] for r in runs) for c in CHECKPOINTS},
        "final": statistics.median(r.final for r in runs),
        "unstable_picks": sum(1 for r in runs if r.unstable),
        "no_pick": sum(1 for r in runs if r.final == 0.0 and not r.unstable),
        "probes": statistics.median(r.probes for r in runs),
        "seconds": statistics.median(r.seconds for r in runs),
        "runs": len(runs),
    }


def replay(table: Table, strategies: dict[str, Callable[[Env], None]], seeds: list[int]) -> dict[str, Any]:
    return {name: summarize(table, [run_one(table, fn, s) for s in seeds]) for name, fn in strategies.items()}


def describe_table(table: Table) -> dict[str, Any]:
    entries = list(table.entries.values())
    statuses: dict[str, int] = {}
    for e in entries:
        s = "stable" if e.stable else ("oom" if any(r["status"] == "oom" for r in e.repeats) else "unstable/failed")
        statuses[s] = statuses.get(s, 0) + 1
    spread = [
        (max(r["samples_per_s"] for r in e.repeats) / min(r["samples_per_s"] for r in e.repeats) - 1)
        for e in entries
        if len(e.repeats) > 1 and all(r["status"] == "ok" and r["samples_per_s"] for r in e.repeats)
    ]
    best_key = max(
        (k for k, e in table.entries.items() if e.stable), key=lambda k: table.entries[k].value, default=None
    )
    return {
        "configs": len(entries),
        "repeats": sum(len(e.repeats) for e in entries),
        "statuses": statuses,
        "grid_seconds": table.grid_seconds,
        "objective": table.objective.unit,
        "best": table.best,
        "best_config": table.entries[best_key].knobs.model_dump() if best_key else None,
        "repeat_spread_median": statistics.median(spread) if spread else None,
        "repeat_spread_max": max(spread) if spread else None,
        "device_memory": table.device_memory,
        "world_size": table.world_size,
        "model": table.raw["model"],
    }


def tracker_artifacts(knobs: Knobs, param_count: int, world_size: int, tracker_version: int = 1) -> int:
    """Bytes the recorded tables' peaks hold that no device holds: they were recorded (2026-11-30) with an emulated
    device that counted (a) DeepSpeed ZeRO-1/2's meta-device shape tensors (``round_robin_bit16_meta`` in
    runtime/zero/stage_1_and_2.py: one per parameter, its size at the job's precision) and (b) with CPU offload, the
    host buffer ``param_buffer_of_bit16_for_cpu_offload_groups`` (one partition at the job's precision). The
    tracker counts neither since (trials/memory.py, trials/engine.py); the estimate models the device, so the
    comparison adds them back rather than fitting them. A table recorded since (``tracker_version`` 2, written by
    benchmarks.record) holds neither: nothing is added."""
    if tracker_version >= 2 or knobs.engine != "deepspeed" or knobs.zero_stage not in (1, 2):
        return 0
    w = 2 if knobs.precision in ("bf16", "fp16") else 4
    meta = w * param_count
    host = w * math.ceil(param_count / world_size) if knobs.offload_optimizer else 0
    return meta + host


def estimator_error(table: Table) -> dict[str, Any] | None:
    """The uncalibrated estimate (plus :func:`tracker_artifacts`) vs every measured peak of the table (ok repeats)."""
    est = table.estimator()
    if est is None:
        return None
    tr = est.trace
    errs = []
    for e in table.entries.values():
        for r in e.repeats:
            if r["status"] == "ok" and r["peak_allocated"]:
                extra = tracker_artifacts(e.knobs, tr.param_count, table.world_size, table.tracker_version)
                errs.append((est.predict(e.knobs).raw + extra) / r["peak_allocated"] - 1.0)
    if not errs:
        return None
    # online: predict each measured peak (grid order) from the calibration on the peaks measured before it
    online = table.estimator()
    seq = []
    for key in table.order:
        e = table.entries[key]
        for r in e.repeats:
            if r["status"] == "ok" and r["peak_allocated"]:
                assert online is not None
                extra = tracker_artifacts(e.knobs, tr.param_count, table.world_size, table.tracker_version)
                if online.observations:
                    seq.append(abs((online.predict(e.knobs).calibrated + extra) / r["peak_allocated"] - 1.0))
                online.observe(e.knobs, r["peak_allocated"] - extra)
    absolute = sorted(abs(x) for x in errs)
    return {
        "n": len(errs),
        "median_abs": statistics.median(absolute),
        "max_abs": absolute[-1],
        "within_10pct": sum(1 for x in absolute if x <= 0.10) / len(absolute),
        "online_median_abs": statistics.median(seq) if seq else None,
        "online_max_abs": max(seq) if seq else None,
    }


#: a probe's recorded phase peaks (ProbeResult.phase_peaks) -> the estimate's phases that make each
PHASE_OF = {
    "train": ("forward_backward", "optimizer_step"),
    "eval_forward": ("eval_forward",),
    "generate": ("generate",),
}


def _phase_peaks(repeat: dict[str, Any]) -> dict[str, int]:
    """A recorded repeat's peak per phase, the most over its ranks (ProbeResult.phase_peaks)."""
    out: dict[str, int] = {}
    for rank in (repeat.get("result") or {}).get("ranks") or []:
        for name, peak in (rank.get("phases") or {}).items():
            out[name] = max(out.get(name, 0), int(peak))
    return out


def phase_errors(table: Table) -> dict[str, dict[str, float]]:
    """Per recorded phase (train, eval forward, generate: what a table whose grid evaluates records), the
    uncalibrated estimate's relative errors against every ok repeat's phase peak: {phase: {n, median_abs,
    max_abs}}; only the phases some repeat recorded (a train-only table: train alone)."""
    est = table.estimator()
    if est is None:
        return {}
    errs: dict[str, list[float]] = {}
    for e in table.entries.values():
        phases = None
        for r in e.repeats:
            measured = _phase_peaks(r)
            if r["status"] != "ok" or not measured:
                continue
            if phases is None:
                extra = tracker_artifacts(e.knobs, est.trace.param_count, table.world_size, table.tracker_version)
                phases = {p.phase: p.total + extra for p in est.breakdown(e.knobs).worst.phases}
            for name, peak in measured.items():
                parts = [phases[p] for p in PHASE_OF.get(name, ()) if p in phases]
                if parts and peak:
                    errs.setdefault(name, []).append(max(parts) / peak - 1.0)
    out = {}
    for name, values in errs.items():
        absolute = sorted(abs(x) for x in values)
        out[name] = {"n": len(absolute), "median_abs": statistics.median(absolute), "max_abs": absolute[-1]}
    return out


def frontier_soundness(table: Table) -> dict[str, Any]:
    """Feeds every config's table verdict to a Frontier in grid order; counts inferences the table contradicts."""
    from tuner.memory.frontier import Frontier

    memory = table.memory()  # the stage order a search derives (tuner.session.memory), LoRA and ZeRO-3 gathers included
    need = memory.frontier.stage_need if memory is not None and memory.frontier is not None else None
    out: dict[str, Any] = {"stage_need": need}
    variants = (
        ("default", Frontier),
        ("zero_order", lambda: Frontier(zero_order=True)),
        ("stage_need", lambda: Frontier(stage_need=need)),
    )
    for label, make in variants:
        f = make()
        wrong = inferred = 0
        for key in table.order:
            e = table.entries[key]
            verdict = f.infer(e.knobs)
            if verdict is not None:
                inferred += 1
                wrong += (verdict == "fits") != e.stable
            f.add(e.knobs, fits=e.stable)
        out[f"{label}_inferred"] = inferred
        out[f"{label}_wrong"] = wrong
        out[f"{label}_conflicts"] = len(f.conflicts)
    return out


def markdown(name: str, info: dict[str, Any], results: dict[str, Any]) -> str:
    lines = [
        f"### {name} (truth: {info['truth']} of repeats)",
        "",
        f"{info['configs']} configs x {info['repeats'] // max(info['configs'], 1)} repeats; {info['statuses']}; "
        f"full grid = {info['grid_seconds']:.0f} probe-s; best {info['best']:.1f} {info['objective']}",
        "",
        "| strategy | to 1% (probe-s) | to 1% (% of grid) | to 5% (% of grid) | @10% | @20% | @50% | final "
        "| unstable picks | probes |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for strat, r in results.items():
        to_s = "never" if r["to_1pct_s"] is None else f"{r['to_1pct_s']:.0f}"
        to_f = "never" if r["to_1pct_frac"] is None else f"{100 * r['to_1pct_frac']:.0f}%"
        to_5 = "never" if r["to_5pct_frac"] is None else f"{100 * r['to_5pct_frac']:.0f}%"
        lines.append(
            f"| {strat} | {to_s} | {to_f} | {to_5} | {r['at']['10%']:.2f} | {r['at']['20%']:.2f} | "
            f"{r['at']['50%']:.2f} | {r['final']:.2f} | {r['unstable_picks']}/{r['runs']} | {r['probes']:.0f} |"
        )
    return "\n".join(lines)


def matrix(everything: dict[str, Any], heldout: bool) -> str:
    """One line per table x variant x strategy: the headline numbers of every replayed table side by side."""
    head = (
        "| table | variant | device / rank | strategy | to 1% (% of grid) | reached | final | unstable picks "
        "| probe-s |"
    )
    cols = "|---|---|---:|---|---:|---:|---:|---:|---:|"
    if heldout:
        head += " held-out to 1% | held-out reached | held-out final | held-out unstable |"
        cols += "---:|---:|---:|---:|"
    lines = [head, cols]

    def pct(r: dict[str, Any]) -> str:
        return "never" if r["to_1pct_frac"] is None else f"{100 * r['to_1pct_frac']:.0f}%"

    for data in everything.values():
        info = data["table"]
        name, _, var = info["name"].partition("@")
        for strat, r in data["results"].items():
            line = (
                f"| {name} | {var or 'full'} | {info['device_memory'] / 2**20:.1f} MiB | {strat} | {pct(r)} | "
                f"{r['reached_1pct_runs']}/{r['runs']} | {r['final']:.2f} | {r['unstable_picks']}/{r['runs']} | "
                f"{r['seconds']:.0f} |"
            )
            h = data.get("heldout", {}).get(strat)
            if heldout and h is None:
                line += " - | - | - | - |"
            elif heldout and h is not None:
                line += (
                    f" {pct(h)} | {h['reached_1pct_runs']}/{h['runs']} | {h['final']:.2f} | "
                    f"{h['unstable_picks']}/{h['runs']} |"
                )
            lines.append(line)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from benchmarks.strategies import EXTRA, STRATEGIES
    from benchmarks.tight import VARIANTS, variant

    ap = argparse.ArgumentParser(prog="python -m benchmarks.replay", description=__doc__.splitlines()[0])
    ap.add_argument("tables", nargs="+", type=Path)
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument(
        "--first-seed", type=int, default=0, help="seeds first-seed .. first-seed + seeds - 1 (held-out checks)"
    )
    ap.add_argument(
        "--heldout",
        metavar="FIRST:COUNT",
        help="also replay the seeds FIRST .. FIRST + COUNT - 1, reported beside the others (e.g. 100:20)",
    )
    ap.add_argument(
        "--variants",
        default="full",
        help=f"comma-separated table variants (benchmarks/tight.py): {', '.join(VARIANTS)}; "
        "q60/q35: the device lowered to that quantile of the table's peaks",
    )
    ap.add_argument("--strategies", default=",".join([*STRATEGIES, *EXTRA]), help="comma-separated subset")
    ap.add_argument("--json", type=Path, help="write all numbers here")
    ap.add_argument("--matrix", type=Path, help="write the table x variant x strategy summary (markdown) here")
    ap.add_argument(
        "--truth",
        choices=("median", "max", "min"),
        default="median",
        help="a config's true objective from its repeats (default median)",
    )
    args = ap.parse_args(argv)
    known = {**STRATEGIES, **EXTRA}
    try:
        chosen = {n: known[n] for n in args.strategies.split(",")}
        variants = args.variants.split(",")
        unknown = [v for v in variants if v not in VARIANTS]
        if unknown:
            raise KeyError(unknown[0])
        heldout = None
        if args.heldout:
            first, _, count = args.heldout.partition(":")
            heldout = list(range(int(first), int(first) + int(count)))
    except (KeyError, ValueError) as exc:
        print(f"error: unknown strategy or variant, or --heldout not FIRST:COUNT ({exc})", file=sys.stderr)
        return 2
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    everything: dict[str, Any] = {}
    for path in args.tables:
        recorded = Table.load(path, truth=args.truth)
        for var in variants:
            table = variant(recorded, var, truth=args.truth)
            info = {**describe_table(table), "truth": args.truth, "name": table.name, "variant": var}
            results = replay(table, chosen, seeds)
            everything[table.name] = {
                "table": info,
                "results": results,
                "estimator": estimator_error(table),
                "frontier": frontier_soundness(table),
            }
            if heldout:
                everything[table.name]["heldout"] = replay(table, chosen, heldout)
            print(markdown(table.name, info, results))
            print(f"\nestimator (uncalibrated) vs measured peaks: {everything[table.name]['estimator']}")
            print(f"frontier soundness on the table: {everything[table.name]['frontier']}\n", flush=True)
    if args.json:
        args.json.write_text(json.dumps(everything, indent=1, default=str))
    if args.matrix:
        args.matrix.write_text(matrix(everything, heldout is not None) + "\n")
    if len(variants) > 1 or heldout:
        print(matrix(everything, heldout is not None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
