"""The fixed cost of an offloaded probe with the fork server's ops preloaded and without (issue 30 §3).

    .venv/bin/python -m benchmarks.preloaded_ops [--repeats 3]

Each repeat starts a fresh server per mode, runs one warm-up probe (server start, ops built) and one measured probe of
builtin:tiny-t5, 1 rank, ZeRO-2 with CPU optimizer offload; prints the median fixed cost (launch to first step) and
the engine's op load (setup_phases["engine.ops"]) per mode.
"""

from __future__ import annotations

import argparse
import statistics

from trials.contract import Knobs
from tuner.probing import forkserver
from tuner.probing.config import probe_config
from tuner.probing.runner import run_probe


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    preloaded = forkserver.built_ops
    knobs = Knobs(micro_batch_size=2, max_length=32, zero_stage=2, offload_optimizer=True)
    cfg = probe_config(knobs=knobs, gradient_accumulation_steps=2, timeout_s=300)
    seen: dict[str, list[tuple[float, float]]] = {"without": [], "preloaded": []}
    for _ in range(args.repeats):
        for mode in seen:
            forkserver.built_ops = preloaded if mode == "preloaded" else (lambda env: [])
            forkserver.shutdown()
            run_probe(cfg, launcher="forkserver")
            r = run_probe(cfg, launcher="forkserver")
            seen[mode].append((r.setup_s or 0.0, r.setup_phases.get("engine.ops", 0.0)))
    for mode, runs in seen.items():
        fixed = statistics.median(s for s, _ in runs)
        ops = statistics.median(o for _, o in runs)
        print(f"{mode:>9}: fixed cost median {fixed:.2f} s, engine.ops median {ops:.2f} s ({len(runs)} probes)")


if __name__ == "__main__":
    main()
