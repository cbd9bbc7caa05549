"""The collective preflight before a search: every rank of the world size, one all_reduce and a barrier, within
90 s. An NCCL hang (P2P over a broken topology, NVLS on a host that cannot, a tiny /dev/shm) would otherwise look like
an ordinary probe timeout and eat the budget one probe at a time."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from trials.contract import free_port
from tuner.probing.verdict import nccl_log, said_tail

PREFLIGHT_TIMEOUT_S = 90.0


def shm_bytes(path: str = "/dev/shm") -> int | None:
    """The size of /dev/shm (NCCL's shared-memory transport lives there; Docker's default is 64 MiB)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_blocks * st.f_frsize


def failure_message(
    world_size: int, timed_out: bool, codes: Sequence[int | None], tails: Sequence[str], shm: int | None
) -> str | None:
    """One line when the preflight failed (None when every rank exited 0), naming the usual NCCL fixes (pure)."""
    if not timed_out and all(code == 0 for code in codes):
        return None
    what = f"hung past {PREFLIGHT_TIMEOUT_S:g} s" if timed_out else f"failed (exit codes {list(codes)})"
    shm_text = f"{shm / 2**20:,.0f} MiB" if shm is not None else "unknown"
    tail = next((t for t in tails if t), "")
    return (
        f"the collective preflight ({world_size} ranks: one all_reduce and a barrier) {what}; try NCCL_P2P_DISABLE=1, "
        f"NCCL_NVLS_ENABLE=0, or a larger /dev/shm (now {shm_text}, e.g. docker --shm-size=8g)"
        + (f" [stderr: {tail}]" if tail else "")
    )


def wait_ranks(procs: Sequence[subprocess.Popen[bytes]], deadline: float) -> bool:
    """Waits for the preflight's ranks; at the deadline, or a moment after any rank failed (every rank is polled each
    round, so a dead later rank is seen at once, not as a hang behind a waiting earlier one), kills all their groups.
    True = timed out."""
    while True:
        codes = [p.poll() for p in procs]
        if all(code is not None for code in codes):
            return False
        timed_out = time.monotonic() >= deadline
        if timed_out or any(code not in (None, 0) for code in codes):
            time.sleep(0.0 if timed_out else 2.0)  # a failed rank's peers: a moment to print their reason
            for p in procs:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGKILL)
            for p in procs:
                p.wait()
            return timed_out
        time.sleep(0.1)


def run_preflight(
    world_size: int, env: dict[str, str], work: Path, timeout_s: float = PREFLIGHT_TIMEOUT_S
) -> str | None:
    """Runs the preflight's ranks (``python -m trials.preflight``) with ``env``; None on success, else the line."""
    work.mkdir(parents=True, exist_ok=True)
    base = dict(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(world_size))
    base["TUNER_PREFLIGHT_TIMEOUT_S"] = str(timeout_s)
    procs: list[subprocess.Popen[bytes]] = []
    errs = [work / f"preflight{r}.stderr" for r in range(world_size)]
    for r in range(world_size):
        with open(errs[r], "wb") as fe:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "trials.preflight"],
                    env=dict(base, RANK=str(r), LOCAL_RANK=str(r), NCCL_DEBUG_FILE=str(nccl_log(errs[r]))),
                    stdout=subprocess.DEVNULL,
                    stderr=fe,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
    timed_out = wait_ranks(procs, time.monotonic() + timeout_s)
    tails = [said_tail(path) for path in errs]
    return failure_message(world_size, timed_out, [p.returncode for p in procs], tails, shm_bytes())
