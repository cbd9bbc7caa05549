"""Throughput on batches drawn from the data vs on batches padded to its worst (issue 21 §2):
``python -m benchmarks.drawn_batches``.

A tiny T5 and its tokenizer saved together, a JSON-lines seq2seq set with a long tail (inputs mostly 5-40 words, 1 in
50 of 300-400; the test fixture tests/helpers/seq2seq_data.py), its lengths read by the real `datasets` + tokenizer
path. Then real probes on CPU (the emulated device, no memory limit), each job as a search probes it, alternating:

- worst: every step padded to the job's max_length, the data's longest sample (what a probe did before: memory and
  throughput both at the worst batch);
- drawn: the memory window at the worst batch, the timed steps on micro batches drawn from seeded shuffled epochs of
  the data under DataCollatorForSeq2Seq's padding (tuner.probing.batches), as `tuner search --dataset` probes now.

Prints, per probe, samples/s and input tokens/s (real: the samples' own tokens; padded: what the device computed on).

    nice .venv/bin/python -m benchmarks.drawn_batches [--samples 2000] [--micro 4] [--steps 24] [--repeats 2]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from tests.helpers.seq2seq_data import long_tail_lengths, save_tiny_t5, write_jsonl
from trials.contract import JobSettings, Knobs, ModelSpec, ProbeResult
from tuner.job.data_job import DataJob
from tuner.job.dataset import DataSource, read_lengths
from tuner.job.lengths import Quantiles
from tuner.probing.batches import data_batches
from tuner.probing.config import probe_config
from tuner.probing.runner import run_probe


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--micro", type=int, default=4)
    parser.add_argument("--steps", type=int, default=24, help="timed micro-steps per probe")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tuner-drawn-bench-"))
    model = save_tiny_t5(work / "t5")
    data_file = write_jsonl(work / "data.jsonl", long_tail_lengths(args.samples))
    src = DataSource(str(data_file), input_column="source", target_column="target")
    lengths = read_lengths(src, str(model), work / "cache", progress=False).lengths
    assert lengths.target is not None
    data = DataJob(lengths, f"{args.samples} samples")
    qi, qt = Quantiles.of(lengths.input), Quantiles.of(lengths.target)
    print(f"data: {len(lengths)} samples; inputs p50 {qi.p50}, p99 {qi.p99}, max {qi.max}; targets max {qt.max}")
    knobs = Knobs(micro_batch_size=args.micro, max_length=qi.max, engine="torch")
    job = JobSettings(max_target_length=qt.max)
    batches = data_batches(
        data, knobs, job, world_size=1, measure_steps=args.steps, gradient_accumulation_steps=1, seed=0
    )
    shown = [b.input_length for b in batches.timed[0]]
    print(f"drawn input lengths (micro {args.micro}, seed 0): {shown}; worst {batches.worst.input_length}")
    found: dict[str, list[ProbeResult]] = {"worst": [], "drawn": []}
    for k in range(args.repeats):
        for name in ("worst", "drawn"):
            cfg = probe_config(
                model=ModelSpec(source=str(model)),
                knobs=knobs,
                job=job,
                measure_steps=args.steps,
                timeout_s=600,
                batches=batches if name == "drawn" else None,
            )
            r = run_probe(cfg, work / f"{name}-{k}")
            assert r.status == "ok", r.cause
            assert r.samples_per_s is not None and r.tokens_per_s is not None
            padded = r.padded_tokens_per_s or r.tokens_per_s
            print(
                f"{name} #{k}: {r.samples_per_s:.1f} samples/s, {r.tokens_per_s:,.0f} input tokens/s "
                f"({'real' if name == 'drawn' else 'padded = counted'}), {padded:,.0f} padded; "
                f"peak {r.peak_allocated:,} B"
            )
            found[name].append(r)
    med = {n: statistics.median(r.samples_per_s or 0.0 for r in rs) for n, rs in found.items()}
    print(f"median samples/s: worst {med['worst']:.1f}, drawn {med['drawn']:.1f} (x{med['drawn'] / med['worst']:.2f})")


if __name__ == "__main__":
    main()
