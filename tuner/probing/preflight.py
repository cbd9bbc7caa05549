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
                    env=dict(base, RANK=str(r), LOCAL_RANK=str(r)),
                    stdout=subprocess.DEVNULL,
                    stderr=fe,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
    deadline = time.monotonic() + timeout_s
    timed_out = False
    while any(p.poll() is None for p in procs):
        if time.monotonic() >= deadline or any(p.returncode not in (None, 0) for p in procs):
            timed_out = time.monotonic() >= deadline
            time.sleep(2.0 if not timed_out else 0.0)  # a failed rank's peers: a moment to print their reason
            for p in procs:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGKILL)
            for p in procs:
                p.wait()
            break
        time.sleep(0.1)
    tails = []
    for path in errs:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
        tails.append(" | ".join(lines[-3:]))
    return failure_message(world_size, timed_out, [p.returncode for p in procs], tails, shm_bytes())
