"""`tuner lengths` through the real entry point: the distribution, -o for --lengths, the cache, bad input."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers.seq2seq_data import expected_lengths, long_tail_lengths, save_tokenizer, write_jsonl
from tuner.job.lengths import read_lengths_file

TUNER = [sys.executable, "-c", "from tuner.cli import main; main()"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    tok = save_tokenizer(root / "tok")
    data = write_jsonl(root / "data.jsonl", long_tail_lengths(400))
    env = {**os.environ, "TUNER_CACHE_DIR": str(root / "cache")}
    return root, tok, data, env


def tuner(env, *args):
    return subprocess.run([*TUNER, *args], capture_output=True, text=True, env=env, timeout=240)


def test_lengths_prints_the_distribution_and_writes_what_lengths_reads(setup):
    root, tok, data, env = setup
    args = ["lengths", "--dataset", str(data), "--tokenizer", str(tok), "--no-progress"]
    args += ["--input-column", "source", "--target-column", "target", "-o", str(root / "l.tsv")]
    first = tuner(env, *args)
    assert first.returncode == 0, first.stderr
    lines = first.stdout.splitlines()
    assert lines[0].startswith("400 samples of") and "(cached)" not in lines[0]
    assert lines[1].split() == ["count", "p50", "p90", "p99", "p99.9", "max", "mean"]
    inputs, targets = expected_lengths(data)
    assert lines[2].split()[:2] == ["inputs", "400"] and lines[2].split()[6] == str(max(inputs))
    assert any(line.startswith("  inputs above: >") and "% of tokens" in line for line in lines)
    assert "inputs (tokens per sample, power-of-two bins):" in lines and any("█" in line for line in lines)
    written = read_lengths_file(root / "l.tsv")
    assert written.input.tolist() == inputs and written.target.tolist() == targets
    again = tuner(env, *args)
    assert again.returncode == 0 and "(cached)" in again.stdout.splitlines()[0]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--input-column", "source", "--target-column", "label"], "has no column 'label'; its columns are"),
        (["--text-column", "source", "--model", "builtin:flan-t5-large"], "built-in preset with no tokenizer"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(setup, extra, message):
    _, tok, data, env = setup
    args = ["lengths", "--dataset", str(data), "--no-progress", *extra]
    if "--model" not in extra:
        args += ["--tokenizer", str(tok)]
    out = tuner(env, *args)
    assert out.returncode == 2, out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0] and "Traceback" not in out.stderr
