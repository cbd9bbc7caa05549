"""`tuner explain` through the real entry point on a tiny T5 (traced in seconds): the job read as `tuner search`
reads it, a crossing config explained with its changes and their searches, and bad input as one line, exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers.seq2seq_data import long_tail_lengths, save_tiny_t5, write_jsonl

TUNER = [sys.executable, "-c", "from tuner.cli import main; main()"]


def _job(tmp_path: Path) -> list[str]:
    model = save_tiny_t5(tmp_path / "t5")
    data = write_jsonl(tmp_path / "data.jsonl", long_tail_lengths(400, tail_every=40, tail=(300, 400)))
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2}}))
    args = [
        "--model",
        str(model),
        "--baseline",
        str(ds),
        "--world-size",
        "1",
        "--storage",
        f"sqlite:///{tmp_path}/t.db",
    ]
    return [*args, "--dataset", str(data), "--input-column", "source", "--target-column", "target"]


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TUNER_CACHE_DIR": str(tmp_path / "cache")}
    return subprocess.run([*TUNER, "explain", *args], capture_output=True, text=True, env=env, timeout=600)


def test_a_crossing_config_is_explained_with_the_changes_that_fit(tmp_path):
    job = _job(tmp_path)
    done = _run(tmp_path, *job, "--device-memory", "40MiB", "--json")
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)
    assert body["worst_batch"]["batch"] == 4 and body["worst_batch"]["input_length"] > 300
    phases = {p["phase"]: p["total"] for p in body["ranks"][0]["phases"]}
    assert body["capacity"] == 40 << 20
    if body["verdict"]["phase"] is None:  # fits: no changes offered
        assert max(phases.values()) <= body["capacity"] and body["changes"] == []
    else:
        assert phases[body["verdict"]["phase"]] > body["capacity"]
        for change in body["changes"]:
            assert change["peak"] * 1.1 <= body["capacity"]
    text = _run(tmp_path, *job, "--device-memory", "40MiB")
    assert text.returncode == 0, text.stderr
    assert "worst batch: 4 x " in text.stdout and "verdict: " in text.stdout and "not covered:" in text.stdout
    assert "crash: your config on your data:" in text.stdout


def test_bad_input_is_one_line_exit_2(tmp_path):
    job = _job(tmp_path)
    for extra, says in (
        (["--device-memory", "40MiB", "--oom-message", "RuntimeError: NCCL error"], "no 'Tried to allocate <size>'"),
        (["--device-memory", "40MiB", "--oom-message", f"@{tmp_path}/none.txt"], "cannot read the --oom-message file"),
        ([], "needs --device-memory"),
    ):
        done = _run(tmp_path, *job, *extra)
        assert done.returncode == 2, done.stdout
        errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and says in errors[0], done.stderr


def test_every_part_of_the_estimate_has_a_column_name_in_explain() -> None:
    from tuner.cli.explain_view import _SHORT
    from tuner.memory.breakdown import PARTS

    assert set(PARTS) <= set(_SHORT)  # a part without one was a KeyError in explain's table (the reference model)
