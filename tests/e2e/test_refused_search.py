"""A search whose every probe is refused (issue 40 §4): T5 under FSDP2 on 2 gloo ranks — its shared embedding is in
two FSDP groups, which accelerate refuses. A real `tuner search`: the stream prints the refusal whole once (never
"FSD…"), the search ends with the refusal's own fix (not "a larger --device-memory or --budget"), `tuner trials` piped
gives each refused trial its whole reason on one line, and `tuner best` ends with the same fix."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.helpers.servers import TUNER_BIN, clean_env

pytestmark = pytest.mark.slow

SPACE = """engine: [fsdp2]
micro_batch_size: [1, 2]
max_length: [16]
reshard_after_forward: [true]
offload_params: [false]
gradient_checkpointing: [false]
"""
REASON = "FSDP2 cannot shard this model: parameter 'shared.weight' is shared by modules accelerate puts in different"
FIX = "untie those weights, or search engine deepspeed"


def test_a_search_whose_every_probe_was_refused_ends_with_the_refusals_fix(tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    url = f"sqlite:///{tmp_path / 't.db'}"
    argv = [TUNER_BIN, "search", "--study", "ff", "--storage", url, "--space", str(space), "--budget", "5m"]
    argv += ["--n-trials", "2", "--finalists", "0", "--world-size", "2", "--global-batch", "4"]
    argv += ["--device-memory", "1GiB", "--seed", "0"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=tmp_path, env=clean_env())
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "\u2026" not in out and out.count(REASON) == 2, out  # once under the first probe, once in the last line
    assert "reason below" in out and "as above" in out
    last = out.strip().splitlines()[-1]
    assert last.startswith("no stable config found: every probe was refused before running: ") and last.endswith(FIX)
    assert "--device-memory" not in last and "--budget" not in last
    trials = subprocess.run(
        [TUNER_BIN, "trials", "--study", "ff", "--storage", url], capture_output=True, text=True, timeout=120
    )
    rows = [line.split("\t") for line in trials.stdout.splitlines()[1:]]
    assert len(rows) == 2 and all(r[1] == "refused" and REASON in r[-1] and FIX in r[-1] for r in rows), trials.stdout
    best = subprocess.run(
        [TUNER_BIN, "best", "--study", "ff", "--storage", url], capture_output=True, text=True, timeout=120
    )
    assert best.returncode == 2 and best.stderr.strip().endswith(FIX), best.stderr
