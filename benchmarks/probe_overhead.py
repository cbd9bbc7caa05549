"""Fixed cost of one probe (launch to first training step), per launcher: ``python -m benchmarks.probe_overhead``.

Runs the same tiny-T5 probes with each launcher, interleaved (so a busy shared machine slows both alike), and prints
median setup_s (launch to first step, as the probe measures it), its phases, and the share it takes of a 30 s probe.

    .venv/bin/python -m benchmarks.probe_overhead --repeats 5 [--json out.json]

Cases: 1 rank plain torch, 1 rank DeepSpeed ZeRO-2, 2 ranks DeepSpeed ZeRO-2. Launchers: spawn (a fresh
``python -m trials`` per rank), forkserver (ranks forked from the preloaded server). The fork server's own start is
paid once per runner process and is reported separately.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from trials.contract import Knobs, ModelSpec, ProbeConfig
from tuner.probing import forkserver as launch_forkserver
from tuner.probing.config import probe_config
from tuner.probing.environment import probe_env
from tuner.probing.runner import run_probe

CASES: dict[str, ProbeConfig] = {
    "1 rank torch": probe_config(
        model=ModelSpec(),
        knobs=Knobs(micro_batch_size=4, max_length=64, engine="torch"),
        gradient_accumulation_steps=2,
        measure_steps=2,
    ),
    "1 rank deepspeed z2": probe_config(
        model=ModelSpec(),
        knobs=Knobs(
            micro_batch_size=4, max_length=64, zero_stage=2, reduce_bucket_size=200_000, allgather_bucket_size=200_000
        ),
        gradient_accumulation_steps=2,
        measure_steps=2,
    ),
    "2 ranks deepspeed z2": probe_config(
        model=ModelSpec(),
        knobs=Knobs(
            micro_batch_size=4,
            max_length=64,
            zero_stage=2,
            overlap_comm=True,
            reduce_bucket_size=200_000,
            allgather_bucket_size=200_000,
        ),
        world_size=2,
        gradient_accumulation_steps=2,
        measure_steps=2,
    ),
}
LAUNCHERS = ("spawn", "forkserver")
REFERENCE_PROBE_S = 30.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    parser.add_argument("--json", type=Path, default=None, help="also write the raw numbers here")
    args = parser.parse_args(argv)

    t0 = time.monotonic()
    launch_forkserver.get_server(probe_env(1))
    server_start_s = time.monotonic() - t0
    for case in args.cases:  # op compiles and first-touch caches happen here, not in the numbers
        run_probe(CASES[case], launcher="spawn")

    raw: dict[str, dict[str, list[dict[str, Any]]]] = {c: {lc: [] for lc in LAUNCHERS} for c in args.cases}
    for _ in range(args.repeats):
        for case in args.cases:
            for launcher in LAUNCHERS:
                res = run_probe(CASES[case], launcher=launcher)
                if res.status != "ok":
                    raise SystemExit(f"{case} / {launcher}: probe {res.status}: {res.cause}")
                raw[case][launcher].append({"setup_s": res.setup_s, "wall_s": res.wall_s, "phases": res.setup_phases})

    print(f"fork server start (once per runner process): {server_start_s:.2f} s")
    print(f"{'case':24} {'launcher':11} {'setup_s p50':>11} {'min':>6} {'max':>6} {'% of 30 s':>9}  phases p50 (s)")
    for case in args.cases:
        for launcher in LAUNCHERS:
            runs = raw[case][launcher]
            setups = [float(r["setup_s"]) for r in runs]
            p50 = statistics.median(setups)
            keys = runs[0]["phases"].keys()
            phases = ", ".join(f"{k} {statistics.median(float(r['phases'][k]) for r in runs):.2f}" for k in keys)
            print(
                f"{case:24} {launcher:11} {p50:11.2f} {min(setups):6.2f} {max(setups):6.2f} "
                f"{100 * p50 / REFERENCE_PROBE_S:8.1f}%  {phases}"
            )
    if args.json:
        args.json.write_text(json.dumps({"server_start_s": server_start_s, "runs": raw}, indent=1))
    launch_forkserver.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
