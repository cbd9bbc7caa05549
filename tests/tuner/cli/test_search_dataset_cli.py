"""`tuner search --dry-run --dataset ...` through the real entry point: the data's lengths on the job line, nothing
written, and a bad column as one line with exit 2 before anything else."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers.seq2seq_data import long_tail_lengths, save_tiny_t5, write_jsonl

TUNER = [sys.executable, "-c", "from tuner.cli import main; main()"]


def test_dry_run_holds_the_datas_longest_sample(tmp_path):
    model = save_tiny_t5(tmp_path / "t5")
    data = write_jsonl(tmp_path / "data.jsonl", long_tail_lengths(200))
    env = {**os.environ, "TUNER_CACHE_DIR": str(tmp_path / "cache")}
    args = [*TUNER, "search", "--dry-run", "--budget", "5m", "--no-estimate", "--model", str(model)]
    args += ["--storage", f"sqlite:///{tmp_path}/t.db", "--dataset", str(data), "--input-column", "source"]
    done = subprocess.run([*args, "--target-column", "target"], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "data: 200 samples of" in out and "  inputs: p50 " in out
    assert "(data's longest sample), labels " in out and "truncation: truncates nothing; padding: longest" in out
    assert not (tmp_path / "t.db").exists()
    bad = subprocess.run([*args, "--target-column", "nope"], capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode == 2
    errors = [line for line in bad.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "has no column 'nope'; its columns are source, target, id" in errors[0]
