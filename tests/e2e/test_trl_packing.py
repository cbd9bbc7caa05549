"""An SFT recipe with TRL's packing through the commands a user types, on builtin:tiny-llama with their data
(tuner.job.packing): the dry run and the estimate read the packed rows (every one max_length tokens) where the
unpacked recipe reads the samples, and trial 0 of a short search runs rows of max_length whose measured need is the
estimate's; with BFD (TRL's default strategy) each micro batch runs as one padding-free row of micro x max_length
tokens (trials.data.flattened), its mask quadratic in that row, measured as estimated."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.seq2seq_data import long_tail_lengths, save_tokenizer, write_jsonl

TUNER = str(Path(sys.executable).with_name("tuner"))
SPACE = "micro_batch_size: [2, 4]\nzero_stage: [0]\ngradient_checkpointing: [false]\n"
RECIPE: dict[str, Any] = {
    "output_dir": "out",
    "per_device_train_batch_size": 4,
    "max_length": 128,
    "bf16": False,  # fp32 on the CPU probe (TRL's default bf16 would be held as well)
    "gradient_checkpointing": False,
    "packing": False,
}
PACKED = {**RECIPE, "packing": True, "packing_strategy": "wrapped"}
BFD = {**RECIPE, "packing": True}  # TRL 1.16's default packing_strategy: bfd, trained padding-free
FREE = {**RECIPE, "padding_free": True, "max_length": None}  # unpacked padding-free: TRL requires max_length null


def tuner(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "CUDA_VISIBLE_DEVICES": "", "TUNER_CACHE_DIR": str(tmp_path / "cache")}
    return subprocess.run([TUNER, *args], capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)


def data_args(tmp_path: Path) -> list[str]:
    """300 samples of 6-71 tokens (the longest well under max_length), and a tokenizer for them."""
    tok = tmp_path / "tok"
    if not tok.exists():
        save_tokenizer(tok)
        write_jsonl(tmp_path / "data.jsonl", long_tail_lengths(300, tail=(60, 70)))
    return ["--dataset", str(tmp_path / "data.jsonl"), "--text-column", "source", "--tokenizer", str(tok)]


def recipe(tmp_path: Path, given: dict[str, Any], name: str) -> str:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(given))
    return str(path)


def test_the_dry_run_of_a_packed_recipe_reads_rows_of_max_length(tmp_path: Path) -> None:
    said = {}
    for name, given in (("unpacked", RECIPE), ("packed", PACKED)):
        base = ["search", "--dry-run", "--model", "builtin:tiny-llama", "--budget", "2m"]
        base += ["--baseline", recipe(tmp_path, given, name), "--storage", f"sqlite:///{tmp_path}/t.db"]
        done = tuner(tmp_path, *base, *data_args(tmp_path))
        assert done.returncode == 0, done.stderr
        said[name] = done.stdout
    assert "inputs: p50 25, p90 39, p99 68, p99.9 70, max 70 tokens (300 samples)" in said["unpacked"]
    assert "packed (your recipe's packing, wrapped) into 60 rows of at most 128 tokens" in said["packed"]
    assert "inputs: p50 128, p90 128, p99 128, p99.9 128, max 128 tokens (60 samples)" in said["packed"]
    assert "packing wrapped: every row max_length tokens (the worst batch is every batch)" in said["packed"]


@pytest.mark.slow
def test_trial_0_of_a_packed_recipe_runs_rows_of_max_length_and_measures_the_estimate(tmp_path: Path) -> None:
    from tuner.storage import Store

    (tmp_path / "space.yaml").write_text(SPACE)
    trial0 = {}
    for name, given in (("unpacked", RECIPE), ("packed", PACKED)):
        url = f"sqlite:///{tmp_path}/{name}.db"
        done = tuner(
            tmp_path,
            *("search", "--model", "builtin:tiny-llama", "--baseline", recipe(tmp_path, given, name)),
            *("--space", "space.yaml", "--storage", url, "--study", name, "--budget", "5m", "--n-trials", "1"),
            *("--finalists", "0", "--device-memory", "160MiB", "--estimate", *data_args(tmp_path)),
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        rows = {r.trial_number: r for r in Store(url).probes(name)}
        trial0[name] = rows[0]
        assert str(rows[0].status) == "ok" and rows[0].memory_need, done.stdout[-2000:]
    packed, unpacked = trial0["packed"].config["batches"], trial0["unpacked"].config["batches"]
    assert packed["worst"]["input_length"] == 128  # every row max_length: the worst batch is every batch
    assert {b["input_length"] for steps in packed["timed"] for b in steps} == {128}
    assert unpacked["worst"]["input_length"] == 70  # the data's longest sample, padded to by the collator
    assert trial0["packed"].memory_need > trial0["unpacked"].memory_need * 1.3  # measured: 11.0 MB against 6.6 MB
    # the estimate of the same config on the same packed data, uncalibrated, against trial 0's measured need:
    # measured -0.0006% (the LoRA test's bound, 1%)
    done = tuner(
        tmp_path, "estimate", "--model", "builtin:tiny-llama", "--baseline", recipe(tmp_path, PACKED, "packed"),
        "--json", *data_args(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    estimate = json.loads(done.stdout)
    assert estimate["config"]["max_length"] == 128 and estimate["config"]["micro_batch_size"] == 4
    assert abs(estimate["raw"] / trial0["packed"].memory_need - 1) < 0.01, (estimate["raw"], trial0)


def estimate(tmp_path: Path, given: dict[str, Any], name: str, *more: str) -> dict[str, Any]:
    done = tuner(
        tmp_path, "estimate", "--model", "builtin:tiny-llama", "--baseline", recipe(tmp_path, given, name), "--json",
        *more,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def test_the_dry_run_of_a_bfd_recipe_reads_its_rows_and_runs_them_padding_free(tmp_path: Path) -> None:
    base = ["search", "--dry-run", "--model", "builtin:tiny-llama", "--budget", "2m"]
    base += ["--baseline", recipe(tmp_path, BFD, "bfd"), "--storage", f"sqlite:///{tmp_path}/t.db"]
    done = tuner(tmp_path, *base, *data_args(tmp_path))
    assert done.returncode == 0, done.stderr
    said = " ".join(done.stdout.split())
    assert "packed (your recipe's packing, bfd) into 60 rows of at most 128 tokens" in said  # best fit: full rows
    assert "inputs: p50 128, p90 128, p99 128, p99.9 128, max 128 tokens (60 samples)" in said
    assert "padding-free (each micro batch one row of micro x length tokens)" in said
    assert "padding-free: each micro batch one row of micro x max_length tokens, position_ids restarting" in said


def test_the_estimate_of_a_bfd_recipe_grows_with_the_square_of_micro_x_max_length(tmp_path: Path) -> None:
    """Wrapped rows attend within each row (M x L^2 at most); BFD's padding-free row of M x L tokens builds its
    (M x L)^2 block-diagonal mask under sdpa: what BFD adds grows ~4x when the micro batch doubles, not 2x."""
    added = {}
    for micro in (1, 2, 4):
        flags = ("--micro-batch-size", str(micro))
        bfd, wrapped = estimate(tmp_path, BFD, "bfd", *flags), estimate(tmp_path, PACKED, "packed", *flags)
        added[micro] = bfd["raw"] - wrapped["raw"]
    # measured 196,608, 671,744, 2,408,448 bytes: x3.4, x3.6
    assert added[1] > 0 and added[2] > 3 * added[1] and added[4] > 3 * added[2], added


@pytest.mark.slow
def test_trial_0_of_a_bfd_recipe_runs_one_padding_free_row_and_measures_the_estimate(tmp_path: Path) -> None:
    from tuner.storage import Store

    (tmp_path / "space.yaml").write_text(SPACE)
    url = f"sqlite:///{tmp_path}/bfd.db"
    done = tuner(
        tmp_path,
        *("search", "--model", "builtin:tiny-llama", "--baseline", recipe(tmp_path, BFD, "bfd")),
        *("--space", "space.yaml", "--storage", url, "--study", "bfd", "--budget", "5m", "--n-trials", "1"),
        *("--finalists", "0", "--device-memory", "160MiB", "--estimate", *data_args(tmp_path)),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    trial0 = {r.trial_number: r for r in Store(url).probes("bfd")}[0]
    assert str(trial0.status) == "ok" and trial0.memory_need, done.stdout[-2000:]
    assert trial0.config["batches"]["worst"]["input_length"] == 128  # the rows, each flattened with the others
    # the estimate of the same config on the same data, uncalibrated, against trial 0's measured need
    bfd = estimate(tmp_path, BFD, "bfd", *data_args(tmp_path))
    assert bfd["config"]["max_length"] == 128 and bfd["config"]["micro_batch_size"] == 4
    assert abs(bfd["raw"] / trial0.memory_need - 1) < 0.01, (bfd["raw"], trial0.memory_need)  # measured -0.0005%
    wrapped = estimate(tmp_path, PACKED, "packed", *data_args(tmp_path))
    # the 512^2 mask against 4 rows of 128 (wrapped with this data: one row short, padded, so 4 x 128^2 masks):
    # estimated 12,664,664 against 11,042,648 bytes
    assert bfd["raw"] > wrapped["raw"] * 1.1, (bfd["raw"], wrapped["raw"])


@pytest.mark.slow
def test_trial_0_of_an_unpacked_padding_free_recipe_runs_its_longest_samples_in_one_row_as_estimated(
    tmp_path: Path,
) -> None:
    from tuner.storage import Store

    (tmp_path / "space.yaml").write_text(SPACE)
    url = f"sqlite:///{tmp_path}/free.db"
    done = tuner(
        tmp_path,
        *("search", "--model", "builtin:tiny-llama", "--baseline", recipe(tmp_path, FREE, "free")),
        *("--space", "space.yaml", "--storage", url, "--study", "free", "--budget", "5m", "--n-trials", "1"),
        *("--finalists", "0", "--device-memory", "160MiB", "--estimate", *data_args(tmp_path)),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    said = " ".join(done.stdout.split())
    assert "length 70 (data's longest sample)" in said and "padding-free (each micro batch one row" in said
    trial0 = {r.trial_number: r for r in Store(url).probes("free")}[0]
    assert str(trial0.status) == "ok" and trial0.memory_need, done.stdout[-2000:]
    assert trial0.config["batches"]["worst"]["input_length"] == 70  # 4 samples of the longest, in one row of 280
    free = estimate(tmp_path, FREE, "free", *data_args(tmp_path))
    assert free["config"]["max_length"] == 70 and free["config"]["micro_batch_size"] == 4
    assert abs(free["raw"] / trial0.memory_need - 1) < 0.01, (free["raw"], trial0.memory_need)
