"""A real FSDP2 search from `tuner search` (issue 31): builtin:tiny-llama on 2 gloo ranks sharded by accelerate's own
FSDP2 preparation, real OOMs pruned, a stable pick; every measured probe says its ranks held shards."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

TUNER = str(Path(sys.executable).with_name("tuner"))
SPACE = """engine: [fsdp2]
micro_batch_size: [2, 4, 8]
max_length: [128]
reshard_after_forward: [true, false]
offload_params: [false]
gradient_checkpointing: [false]
"""


def tuner(*args: str, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([TUNER, *args], capture_output=True, text=True, timeout=timeout, env=env, check=False)


@pytest.fixture(scope="module")
def searched(tmp_path_factory):  # type: ignore[no-untyped-def]
    d = tmp_path_factory.mktemp("fsdp2")
    space = d / "space.yaml"
    space.write_text(SPACE)
    db = d / "tuner.db"
    url = f"sqlite:///{db}"
    # 12 MiB per rank: micro 2 and 4 fit (5.5-5.8 / 9.7-10.0 MiB at 128 tokens), micro 8 runs out (18 MiB)
    args = ["--budget", "2m", "--model", "builtin:tiny-llama", "--world-size", "2", "--device-memory", "12MiB"]
    done = tuner("search", *args, "--space", str(space), "--global-batch", "16", "--storage", url, "--study", "f")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return url, db, d, done


@pytest.mark.slow
def test_fsdp2_search_prunes_real_ooms_and_picks_a_sharded_stable_config(searched) -> None:  # type: ignore[no-untyped-def]
    url, db, _, done = searched
    with sqlite3.connect(db) as con:
        rows = [
            (status, json.loads(knobs), json.loads(result) if result else None, stable)
            for status, knobs, result, stable in con.execute("select status, knobs, result, stable from tuner_probes")
        ]
    measured = [(s, k, r, st) for s, k, r, st in rows if r is not None]
    assert any(s == "oom" and k["micro_batch_size"] == 8 for s, k, _, _ in measured)
    ok = [(k, r) for s, k, r, st in measured if s == "ok" and st]
    assert ok and all(k["engine"] == "fsdp2" for k, _ in ok)
    assert all(r["sharded"] is True for _, r in ok)  # sharded on every rank, never a replicated model
    assert "the pick: " in done.stdout and "fsdp2" in done.stdout.split("the pick: ")[1].splitlines()[0]
    best = json.loads(tuner("best", "--storage", url, "--study", "f").stdout)
    assert best["knobs"]["engine"] == "fsdp2" and best["knobs"]["micro_batch_size"] in (2, 4)


@pytest.mark.slow
def test_the_fsdp2_pick_exports_an_accelerate_fsdp2_config_and_no_deepspeed_json(searched) -> None:  # type: ignore[no-untyped-def]
    import yaml

    url, _, d, _ = searched
    out = d / "accelerate.yaml"
    done = tuner("best", "--storage", url, "--study", "f", "--format", "accelerate", "-o", str(out))
    assert done.returncode == 0, done.stderr
    config = yaml.safe_load(out.read_text())
    best = json.loads(tuner("best", "--storage", url, "--study", "f").stdout)["knobs"]
    fsdp = config["fsdp_config"]
    assert config["distributed_type"] == "FSDP" and config["num_processes"] == 2 and fsdp["fsdp_version"] == 2
    assert fsdp["fsdp_reshard_after_forward"] is best["reshard_after_forward"]  # explicit, as probed
    assert fsdp["fsdp_offload_params"] is False and fsdp["fsdp_activation_checkpointing"] is False
    ds = tuner("best", "--storage", url, "--study", "f", "--format", "deepspeed")
    assert ds.returncode == 2 and len(ds.stderr.strip().splitlines()) == 1 and "fsdp2" in ds.stderr


@pytest.mark.slow
def test_an_fsdp2_oom_trial_is_explained_part_by_part_with_its_failed_allocation(searched) -> None:  # type: ignore[no-untyped-def]
    url, db, _, _ = searched
    with sqlite3.connect(db) as con:
        trials = [n for n, s, r in con.execute("select trial_number, status, result from tuner_probes") if r]
        oom = next(
            n for n, s, r in con.execute("select trial_number, status, result from tuner_probes") if r and s == "oom"
        )
    assert oom in trials
    done = tuner("explain", "--storage", url, "--study", "f", "--trial", str(oom))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    out = done.stdout
    assert "FSDP2" in out.split("config: ")[1].splitlines()[0]
    header = re.split(r"peak by phase and part, (?:MiB|GiB)", out)[1].splitlines()[0]  # units follow the device
    assert "gather" in header and "ZeRO" not in header  # FSDP2's gathered parameters in the ZeRO buffers' place
    assert "recorded failure, rank " in out and "tried to allocate" in out  # the failed allocation it kept
