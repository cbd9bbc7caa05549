"""`tuner search --nnodes N --nproc-per-node G` through the real entry point, before any worker meets another: a
layout or storage it cannot run is one line and exit 2; the dry run speaks in node-hours and says what a search across
nodes needs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TUNER = str(Path(sys.executable).with_name("tuner"))
PG = "postgresql+psycopg://nobody@127.0.0.1:1/never"  # the dry run reads no database


def tuner(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "COLUMNS": "400", **(env or {})}
    return subprocess.run([TUNER, *args], capture_output=True, text=True, timeout=120, env=full, check=False)


def test_a_search_across_nodes_on_sqlite_is_refused_in_one_line(tmp_path: Path) -> None:
    done = tuner(
        "search", "--budget", "1m", "--nnodes", "2", "--nproc-per-node", "2", "--storage", f"sqlite:///{tmp_path}/t.db"
    )
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "PostgreSQL" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "t.db").exists()  # refused before anything is written


def test_a_layout_that_does_not_add_up_is_refused_in_one_line() -> None:
    done = tuner(
        "search", "--budget", "1m", "--nnodes", "2", "--nproc-per-node", "2", "--world-size", "3", "--storage", PG
    )
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "--world-size 3 is not --nnodes 2 x --nproc-per-node 2" in done.stderr


def test_the_dry_run_across_nodes_speaks_in_node_hours() -> None:
    args = ("search", "--dry-run", "--budget", "2h", "--nnodes", "2", "--nproc-per-node", "4", "--storage", PG)
    done = tuner(*args, "--model", "builtin:tiny-llama", "--no-estimate")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "world size 8 (2 nodes x 4 ranks)" in out and "budget 7200 s = 4.00 node-hours on 2 nodes" in out
    assert "node-hours on 2 nodes (before any probe" in out and "srun -N 2 --ntasks-per-node 1" in out
    assert "zero_hpz_partition_size: default, 4" in out  # hpZ over a node's ranks, searched beside none


def test_srun_across_two_nodes_is_a_search_across_two_nodes() -> None:
    slurm = {"SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "2", "SLURM_NODEID": "0", "SLURM_GPUS_ON_NODE": "2"}
    done = tuner("search", "--dry-run", "--budget", "1h", "--storage", PG, "--no-estimate", env=slurm)
    assert done.returncode == 0, done.stderr
    assert "world size 4 (2 nodes x 2 ranks)" in done.stdout
