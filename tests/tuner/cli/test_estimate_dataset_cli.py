"""`tuner estimate --dataset ...` through the real entry point (issue 21 §1, §3): the job is held at the data's
longest sample as `tuner search` holds it, the data's lengths are printed, and with --device-memory the crash line
says how often a batch of their data does not fit and when a shuffled run meets the first. The estimate is the real
one (a fake-tensor trace of a tiny T5 saved with its tokenizer)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.helpers.seq2seq_data import expected_lengths, long_tail_lengths, save_tiny_t5, write_jsonl

TUNER = [sys.executable, "-c", "from tuner.cli import main; main()"]


def test_estimate_reads_the_data_and_says_when_the_config_crashes(tmp_path):
    model = save_tiny_t5(tmp_path / "t5")
    data = write_jsonl(tmp_path / "data.jsonl", long_tail_lengths(400))
    inputs, targets = expected_lengths(data)
    env = {**os.environ, "TUNER_CACHE_DIR": str(tmp_path / "cache")}
    args = [*TUNER, "estimate", "--model", str(model), "--dataset", str(data), "--input-column", "source"]
    args += ["--target-column", "target", "--micro-batch-size", "2", "--json"]
    # 20 MiB: a median batch (2 x ~26 tokens) fits, the worst (2 x the longest input) does not
    done = subprocess.run([*args, "--device-memory", "20MiB"], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["config"]["max_length"] == max(inputs)  # the data's longest sample: their args truncate nothing
    assert out["data"][0].startswith(f"data: 400 samples of {data} [train]")
    assert out["data"][3] == (
        f"lengths: inputs {max(inputs)} (data's longest sample), labels {max(targets)} (data's longest sample)"
    )
    assert out["verdict"] == "over budget" and out["calibrated"] > 20 * 2**20
    crash = out["crash"]
    assert crash.startswith("this config on your data: 1 batch in ")
    assert f"needs more than 20.0 MiB (the worst, 2 x {max(inputs)} tokens" in crash
    assert "with shuffling your run crashes after about" in crash
    # the cache holds the lengths; with room for every batch the line says so
    roomy = subprocess.run([*args, "--device-memory", "1GiB"], capture_output=True, text=True, env=env, timeout=600)
    assert roomy.returncode == 0, roomy.stderr
    assert json.loads(roomy.stdout)["crash"].startswith("this config on your data: every batch fits in 1.00 GiB")
    # a bad column is one line, exit 2, before the trace
    wrong = [*args[:-5], "--target-column", "nope", "--micro-batch-size", "2"]
    bad = subprocess.run(wrong, capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode == 2
    errors = [line for line in bad.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "has no column 'nope'" in errors[0]
