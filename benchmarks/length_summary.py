"""The stored data summary (issue 21 §3): its size, and the crash odds it gives against the full lengths.

``python -m benchmarks.length_summary [--samples 100000]``: the seed-shaped lengths of benchmarks/lengths_read.py
(inputs lognormal around 180 tokens clipped to 60-600, 1 sample in 400 of 6,000-9,000; targets 5-60; each + the
end-of-sequence token) drawn directly as numbers (no text, no tokenizer), summarised (tuner.job.length_summary), and
the crash odds (tuner.memory.crash) of a few configs from the summary's cells and from every sample's lengths. The
need is an attention-shaped stand-in (20 GiB of states + per sample 0.9 MB x L + 128 B x L^2 + 0.2 MB per label
token), not a trace of a model: it exercises the arithmetic at flan-t5-large-like magnitudes, world size 4."""

from __future__ import annotations

import argparse
import json
import time

from tests.helpers.seq2seq_data import seed_shaped
from tuner.job.length_summary import DataOrigin, LengthSummary
from tuner.job.padding import BatchShape, Collation
from tuner.memory.crash import crash_odds

GiB = 1 << 30
CONFIGS = ((2, 79.15), (4, 79.15), (8, 60.0), (16, 40.0), (32, 40.0))  # (micro batch, GiB per rank)


def need(shape: BatchShape) -> float:
    length = shape.input_length
    return 20 * GiB + shape.batch * (0.9e6 * length + 128.0 * length * length + 2e5 * (shape.target_length or 0))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=100_000)
    args = parser.parse_args()
    lengths = seed_shaped(args.samples)
    t0 = time.perf_counter()
    summary = LengthSummary.of(lengths, DataOrigin("seed-shaped", "train", "source", "target", total=args.samples))
    took = time.perf_counter() - t0
    text = json.dumps(summary.to_json(), separators=(",", ":"))
    cells, counts = summary.cells()
    print(f"{args.samples:,} samples: summary {len(text):,} bytes of JSON, {len(counts)} cells, {took:.2f} s")
    print(summary.rounding.describe())
    for micro, gib in CONFIGS:
        t0 = time.perf_counter()
        full = crash_odds(lengths, micro, 4, Collation(), need, int(gib * GiB))
        t_full = time.perf_counter() - t0
        t0 = time.perf_counter()
        summ = crash_odds(cells, micro, 4, Collation(), need, int(gib * GiB), counts)
        t_summ = time.perf_counter() - t0
        print(
            f"micro {micro:>2} in {gib:.2f} GiB: full 1 in {_one_in(full.unfit_share)}, median {full.median_samples}, "
            f"p90 {full.p90_samples}, worst {full.worst_need / GiB:.2f} GiB ({t_full:.2f} s) | summary 1 in "
            f"{_one_in(summ.unfit_share)}, median {summ.median_samples}, p90 {summ.p90_samples}, worst "
            f"{summ.worst_need / GiB:.2f} GiB ({t_summ:.3f} s)"
        )


def _one_in(share: float) -> str:
    return "-" if share <= 0 else f"{round(1 / share):,}"


if __name__ == "__main__":
    main()
