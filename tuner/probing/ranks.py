"""A probe's ranks as processes: launched by the runner itself, each in its own session, supervised, killed as groups.

Every rank is started directly with the torch.distributed env (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT), what torchrun does on one node, as a fresh ``python -m trials`` or a child of the preloaded fork server,
each in its own session (process group), so that:

* the runner sees every rank's own exit status, without parsing any launcher's output;
* at the timeout, or ``FAILURE_GRACE_S`` after any rank fails (its peers may be blocked in a collective), every group
  is killed with SIGKILL: no hung survivors, children (op compiles) included.

Each rank's pid (also its group id) is written to ``rank<r>.pid`` in the work folder, its stdout / stderr to
``rank<r>.stdout`` / ``.stderr``; its account comes back in its result file or its reason record
(``trials.contract.rank_out_path``, ``reason_path``), read here, judged in tuner.probing.verdict.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from pydantic import BaseModel

from trials.contract import (
    EXIT_OK,
    LAUNCH_ENV,
    ProbeConfig,
    RankReason,
    RankResult,
    Status,
    allocator_env,
    free_port,
    rank_out_path,
    reason_path,
)
from tuner.probing import forkserver as launch_forkserver

FAILURE_GRACE_S = 5.0  # after a rank fails, how long its peers get to write their own result before the group kill
POLL_S = 0.05

_M = TypeVar("_M", bound=BaseModel)


class Proc(Protocol):
    """A rank's process: a subprocess.Popen or a fork server's ForkedRank."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int | None: ...


def _read(path: Path, model: type[_M]) -> _M | None:
    if not path.exists():
        return None
    try:
        return model.model_validate_json(path.read_text())
    except (OSError, ValueError):
        return None  # written atomically, so only a foreign file gets here


@dataclass
class Rank:
    rank: int
    proc: Proc
    out: Path  # where its result file goes
    err: Path  # its stderr
    killed_by_us: bool = False
    local_rank: int | None = None  # on a node of a probe across nodes (None: this host's ranks, local = global)
    _result: RankResult | None = None
    _reason: RankReason | None = None

    @property
    def local(self) -> int:
        return self.rank if self.local_rank is None else self.local_rank

    def read(self) -> RankResult | None:
        """Its result file (trials.contract.RankResult), once written."""
        if self._result is None:
            self._result = _read(self.out, RankResult)
        return self._result

    def reason(self) -> RankReason | None:
        """Its reason record (trials.last_words), when it could not write its result."""
        if self._reason is None:
            self._reason = _read(reason_path(self.out), RankReason)
        return self._reason

    def failed(self) -> bool:
        """It exited with a failure code or reported a failure (its peers then get FAILURE_GRACE_S)."""
        res = self.read()
        return self.proc.returncode not in (None, EXIT_OK) or (res is not None and res.status != Status.OK)

    @property
    def launch_fault(self) -> bool:
        """The rank said its failure was the launch's, not the config's (RankResult / RankReason.launch_fault)."""
        said = self.read() or self.reason()
        return said is not None and said.launch_fault


def kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def rank_env(
    config: ProbeConfig, base: dict[str, str], launch_t: float, extra: dict[str, str] | None
) -> dict[str, str]:
    """The environment shared by a probe's ranks (each adds its RANK / LOCAL_RANK)."""
    world = config.world_size
    env = dict(base)
    env.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world)
    )
    env[LAUNCH_ENV] = repr(launch_t)
    env.update(allocator_env(config.knobs.alloc_conf))  # before any CUDA call of the rank
    env.update(extra or {})
    return env


def _start(
    cfg_path: Path, out: Path, env: dict[str, str], work: Path, r: int, server: launch_forkserver.ForkServer | None
) -> Proc:
    so, se = work / f"rank{r}.stdout", work / f"rank{r}.stderr"
    if server is not None:
        request = {"config": str(cfg_path), "out": str(out), "env": env, "cwd": str(work)}
        return server.spawn({**request, "stdout": str(so), "stderr": str(se)})
    with open(so, "wb") as fo, open(se, "wb") as fe:
        return subprocess.Popen(
            [sys.executable, "-m", "trials", "--config", str(cfg_path), "--out", str(out)],
            env=env,
            stdout=fo,
            stderr=fe,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=str(work),
        )


def launch(
    config: ProbeConfig, work: Path, env: dict[str, str], server: launch_forkserver.ForkServer | None
) -> list[Rank]:
    """Starts every rank of ``config`` in ``work`` with ``env`` (``rank_env``), forked by ``server`` or spawned.
    Raises OSError when one cannot start (the ranks already started are killed first)."""
    cfg_path = work / "probe.json"
    cfg_path.write_text(config.model_dump_json(indent=1))
    out = work / "result.json"
    world = config.world_size
    ranks: list[Rank] = []
    try:
        for r in range(world):
            path = rank_out_path(out, r, world)
            path.unlink(missing_ok=True)
            reason_path(path).unlink(missing_ok=True)  # a retry's ranks speak for themselves
            nccl = str(work / f"rank{r}.nccl")  # verdict.nccl_log: NCCL's reason reaches the cause
            proc = _start(
                cfg_path, out, dict(env, RANK=str(r), LOCAL_RANK=str(r), NCCL_DEBUG_FILE=nccl), work, r, server
            )
            pid_tmp = work / f"rank{r}.pid.tmp"
            pid_tmp.write_text(str(proc.pid))
            os.replace(pid_tmp, work / f"rank{r}.pid")  # the rank's pid is also its process group id
            ranks.append(Rank(r, proc, path, work / f"rank{r}.stderr"))
    except OSError:
        for launched in ranks:
            kill_group(launched.proc.pid)
            launched.proc.wait()
        raise
    return ranks


def _kill_running(ranks: Sequence[Rank]) -> None:
    running = [r for r in ranks if r.proc.poll() is None]
    for r in running:
        r.killed_by_us = True
        kill_group(r.proc.pid)
    for r in running:
        r.proc.wait()


def supervise(ranks: Sequence[Rank], deadline: float) -> bool:
    """Waits for every rank; kills all groups at the deadline or FAILURE_GRACE_S after a failure. True = timed out."""
    failed_at: float | None = None
    timed_out = False
    while any(r.proc.poll() is None for r in ranks):
        now = time.monotonic()
        if failed_at is None and any(r.failed() for r in ranks):
            failed_at = now
        timed_out = now >= deadline
        if timed_out or (failed_at is not None and now - failed_at >= FAILURE_GRACE_S):
            _kill_running(ranks)
            break
        time.sleep(POLL_S)
    for r in ranks:  # stray children (compile jobs) of ranks that exited on their own
        kill_group(r.proc.pid)
    return timed_out


__all__ = ["FAILURE_GRACE_S", "Proc", "Rank", "kill_group", "launch", "rank_env", "supervise"]
