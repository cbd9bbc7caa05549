"""trials.contract: what both sides of the probe process boundary agree on, defined once. Pure, no torch."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from trials.contract import (
    BUCKET_KNOBS,
    DS_DEFAULT_BUCKET,
    OP_LIBRARIES,
    Knobs,
    free_port,
    rank_out_path,
)


def test_rank_result_paths() -> None:
    out = Path("/w/result.json")
    assert rank_out_path(out, 0, 1) == out
    assert [rank_out_path(out, r, 2).name for r in range(2)] == ["result.rank0.json", "result.rank1.json"]
    assert rank_out_path(Path("/w/result"), 1, 4).name == "result.rank1.json"


def test_free_port_is_bindable() -> None:
    port = free_port()
    assert 0 < port < 65536
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_bucket_knobs_are_the_knobs_and_the_default_is_deepspeeds() -> None:
    assert set(BUCKET_KNOBS) <= set(Knobs.model_fields)
    assert DS_DEFAULT_BUCKET == 500_000_000  # deepspeed.runtime.zero.config: reduce/allgather_bucket_size 5e8


def test_the_op_builder_knows_every_op_the_runner_checks() -> None:
    from trials.ops import OPS

    assert set(OPS) == set(OP_LIBRARIES)


def test_the_contract_imports_no_torch() -> None:
    code = (
        "import sys, trials.contract; sys.exit(int(any(m == 'torch' or m.startswith('torch.') for m in sys.modules)))"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
