"""A rank that cannot write its result says why, typed (trials.last_words -> trials.contract.RankReason), and the
runner's verdict reads that before the exit code, and the exit code before the stderr fallback
(tuner.probing.verdict). Real rank processes: spawned ``python -m trials``, fork-server children, real threads."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from trials.contract import EXIT_ERROR, EXIT_OOM, Knobs, ProbeResult, RankReason, RankResult, reason_path
from tuner.probing import forkserver as launch_forkserver
from tuner.probing.config import probe_config
from tuner.probing.environment import probe_env
from tuner.probing.ranks import Proc, Rank, rank_env
from tuner.probing.runner import run_probe
from tuner.probing.verdict import merge, rank_status

TINY_OOM = probe_config(  # the emulated device of 8 MB cannot hold a micro batch of 8 x 128: an OOM in seconds
    knobs=Knobs(micro_batch_size=8, max_length=128, engine="torch"), device_memory=8_000_000, timeout_s=240
)


def _finished(code: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", f"import sys; sys.exit({code})"])
    proc.wait()
    return proc


def _rank(tmp_path: Path, proc: Proc, stderr: str = "") -> Rank:
    err = tmp_path / "rank0.stderr"
    err.write_text(stderr)
    return Rank(0, proc, tmp_path / "result.json", err)


def test_the_ranks_own_account_comes_first_then_its_reason_then_its_exit_code(tmp_path: Path) -> None:
    """Each rank's status from the first evidence there is; stderr only when there is none (here: a watchdog text)."""
    rank = _rank(tmp_path, _finished(EXIT_ERROR), "Watchdog caught collective operation timeout")
    assert rank_status(rank, False, None)[0] == "timeout"  # nothing else to go on: the stderr fallback
    reason = RankReason(rank=0, status="oom", cause="OutOfMemoryError: on thread x", source="thread", phase="eval")
    reason_path(rank.out).write_text(reason.model_dump_json())
    rank = _rank(tmp_path, _finished(EXIT_ERROR), "Watchdog caught collective operation timeout")
    status, cause = rank_status(rank, False, None)
    assert status == "oom" and cause == "rank 0: OutOfMemoryError: on thread x"
    merged = merge(TINY_OOM, [rank], False, 1.0)
    assert merged.status == "oom" and merged.phase == "eval"
    rank.out.write_text(RankResult(rank=0, status="timeout", cause="DistBackendError: timed out").model_dump_json())
    rank = _rank(tmp_path, _finished(EXIT_ERROR))
    assert rank_status(rank, False, None) == ("timeout", "DistBackendError: timed out")  # its result file wins


def test_a_side_threads_failure_names_a_rank_that_then_hangs_until_it_is_killed(tmp_path: Path) -> None:
    """A real process: an OOM on a side thread is written the moment it happens; the main thread then hangs (as in a
    collective) and is killed at the timeout, as the runner does. The probe is an OOM, not a timeout."""
    out = tmp_path / "result.json"
    script = textwrap.dedent(
        """
        import sys, threading, time
        from pathlib import Path
        import torch
        from trials.last_words import LastWords

        def side():
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

        with LastWords(Path(sys.argv[1]), rank=0):
            threading.Thread(target=side, name="prefetch").start()
            time.sleep(600)
        """
    )
    err = tmp_path / "rank0.stderr"
    with err.open("wb") as fe:
        proc = subprocess.Popen([sys.executable, "-c", script, str(out)], stderr=fe)
    deadline = time.monotonic() + 120
    while not reason_path(out).exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert proc.poll() is None, err.read_text()
    proc.kill()
    proc.wait()
    rank = Rank(0, proc, out, err, killed_by_us=True)
    reason = rank.reason()
    assert reason is not None and reason.source == "thread"
    status, cause = rank_status(rank, True, None)
    assert status == "oom" and "on thread prefetch: OutOfMemoryError: CUDA out of memory" in (cause or "")
    assert merge(TINY_OOM, [rank], True, 1.0).status == "oom"
    assert "Traceback" in err.read_text()  # the hook keeps the traceback a person reads


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["spawn", "forkserver"])
def test_a_rank_that_cannot_write_its_result_leaves_its_reason_and_exit_code(tmp_path: Path, launcher: str) -> None:
    """Its result path is taken (a folder): the OOM it measured reaches the runner through its reason record, and its
    exit code is the OOM's, from a spawned ``python -m trials`` and a fork server's child alike."""
    cfg_path, out = tmp_path / "probe.json", tmp_path / "result.json"
    cfg_path.write_text(TINY_OOM.model_dump_json())
    out.mkdir()
    env = dict(rank_env(TINY_OOM, probe_env(1), time.time(), None), RANK="0", LOCAL_RANK="0")
    err = tmp_path / "rank0.stderr"
    proc: Proc
    if launcher == "forkserver":
        server = launch_forkserver.get_server(probe_env(1))
        request = {"config": str(cfg_path), "out": str(out), "env": env, "cwd": str(tmp_path)}
        proc = server.spawn({**request, "stdout": str(tmp_path / "rank0.stdout"), "stderr": str(err)})
    else:
        with err.open("wb") as fe:
            cmd = [sys.executable, "-m", "trials", "--config", str(cfg_path), "--out", str(out)]
            proc = subprocess.Popen(cmd, env=env, stderr=fe, cwd=tmp_path, start_new_session=True)
    assert proc.wait(timeout=240) == EXIT_OOM, err.read_text()
    rank = Rank(0, proc, out, err)
    assert rank.read() is None
    reason = rank.reason()
    assert reason is not None and reason.source == "result-write" and reason.phase is not None
    result = merge(TINY_OOM, [rank], False, 1.0)
    assert result.status == "oom", result.cause
    assert "out of memory" in (result.cause or "") and "could not be written" in (result.cause or "")


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["spawn", "forkserver"])
def test_an_interrupted_rank_is_killed_not_an_error_and_is_retried_once(tmp_path: Path, launcher: str) -> None:
    """SIGINT from outside: the rank writes "killed" down (or, still importing, exits by SIGINT, which says the same):
    no verdict on the config, so the probe runs once more."""
    cfg = probe_config(
        knobs=Knobs(micro_batch_size=1, max_length=8, engine="torch"), measure_steps=10**7, timeout_s=120
    )
    box: dict[str, ProbeResult] = {}
    worker = threading.Thread(target=lambda: box.setdefault("r", run_probe(cfg, tmp_path, launcher=launcher)))
    worker.start()
    pid_file = tmp_path / "rank0.pid"
    stopped: set[int] = set()
    deadline = time.monotonic() + 240
    while len(stopped) < 2 and time.monotonic() < deadline and worker.is_alive():
        pid = int(pid_file.read_text()) if pid_file.exists() else None
        if pid is not None and pid not in stopped:
            time.sleep(1.0)
            os.kill(pid, signal.SIGINT)
            stopped.add(pid)
        time.sleep(0.05)
    worker.join(120)
    assert len(stopped) == 2, "the interrupted probe was not launched a second time"
    result = box["r"]
    assert result.status == "killed" and result.attempts == 2, result.cause
    assert "interrupted by SIGINT from outside" in (result.cause or "")  # the rank's own record, not its exit code
    if launcher == "forkserver":  # forked after the imports: the probe exists, with where it was
        assert result.phase is not None
