"""DeepSpeed JIT ops a probe needs, compiled once before any probe's clock starts (``python -m trials.ops``).

A first-use compile costs 25-40 s on an idle machine, minutes on a busy one: inside a probe it eats the timeout, and
a probe killed mid-build leaves torch's build lock behind so every later load waits on it. Builds are serialised
across runner processes with an flock; a build this runner had to kill has its stale lock removed. A lock another
builder holds (DeepSpeed JIT-building in a Trainer that shares the cache) is waited on, and removed only once it is
older than any build (``LOCK_STALE_S``): removing a live one fails that builder at its release. A library ninja
would rebuild (sources newer than it: a reinstalled venv) counts as missing, so it is rebuilt here too.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from trials.contract import OP_LIBRARIES as OP_LIBS
from trials.contract import ProbeConfig, needed_ops
from tuner.probing import gpus

BUILD_TIMEOUT_S = 1800.0
LOCK_STALE_S = 900.0  # torch's FileBaton older than this: its builder died (a cpu_adam build is 1-3 min on 2 cores)


def prepare_ops(gpu_host: bool) -> list[str]:
    """What ``tuner prepare`` builds: every op any probe on this host may load."""
    return ["cpu_adam", "fused_adam"] if gpu_host else ["cpu_adam", "shm_comm"]


def missing_ops(ops: list[str], ext_dir: Path) -> list[str]:
    """The ops a probe would have to build itself: no library yet, or one ninja would rebuild (``stale``)."""
    return [
        op for op in ops if not (ext_dir / OP_LIBS[op] / f"{OP_LIBS[op]}.so").exists() or stale(ext_dir / OP_LIBS[op])
    ]


def stale(op_dir: Path) -> bool:
    """ninja's own verdict (a dry run, ``ninja -n``) on a built op: its sources or headers are newer than the library,
    e.g. after tuner, DeepSpeed or torch was reinstalled into the same venv path. torch's JIT load in a rank would then
    rebuild it inside the probe (45 s here, past short timeouts) and a rank killed mid-build leaves the lock behind."""
    ninja = shutil.which("ninja", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if ninja is None or not (op_dir / "build.ninja").exists():
        return False  # no ninja: nothing to ask (torch cannot build either); no build file: not ours to judge
    try:
        done = subprocess.run([ninja, "-C", str(op_dir), "-n"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode != 0 or "no work to do" not in done.stdout


@contextlib.contextmanager
def _build_lock(ext_dir: Path) -> Iterator[None]:
    ext_dir.mkdir(parents=True, exist_ok=True)
    with open(ext_dir / "tuner-build.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


OpOutcome = Literal["built", "cached", "not-needed", "failed"]


@dataclass(frozen=True)
class OpBuild:
    """What became of one op a probe or `tuner prepare` needs (``trials.ops`` says it for a build)."""

    op: str
    outcome: OpOutcome
    reason: str = ""
    seconds: float = 0.0

    def line(self) -> str:
        took = f" in {self.seconds:.0f}s" if self.outcome == "built" else ""
        return f"{self.op}: {self.outcome}{took}" + (f" ({self.reason})" if self.reason else "")


# builds that failed in this process, by (op cache, op): every later probe needing the op is refused with the same
# reason at once instead of compiling again (a failed build can take minutes; its cause does not change mid-search)
_FAILED: dict[tuple[str, str], OpBuild] = {}


def ensure_ops(config: ProbeConfig, env: dict[str, str]) -> list[OpBuild]:
    """Builds the ops ``config`` needs on this host (``needed_ops``: a GPU host is one with visible NVIDIA devices)
    that are not in the cache yet, before the probe's clock; what became of each."""
    return build_ops(needed_ops(config, gpus.has_visible_gpus(env)), env)


def refusal(builds: list[OpBuild]) -> str | None:
    """Why a probe needing ``builds`` must not start (it would compile inside its clock, or fail at its first
    step), or None."""
    failed = [b for b in builds if b.outcome == "failed"]
    if not failed:
        return None
    said = "; ".join(f"{b.op}: {b.reason}" for b in failed)
    ops = ", ".join(b.op for b in failed)
    return f"DeepSpeed op(s) {ops} could not be built ({said}); `tuner prepare` builds each op and says why"


def build_ops(ops: list[str], env: dict[str, str]) -> list[OpBuild]:
    """Builds those of ``ops`` not in the cache yet, each in its own process, one build at a time across this host's
    runners; what became of each (in ``ops``' order)."""
    ext_dir = Path(env["TORCH_EXTENSIONS_DIR"])
    out: dict[str, OpBuild] = {}
    todo = []
    for op in ops:
        failed = _FAILED.get((str(ext_dir), op))
        if failed is not None:
            out[op] = failed
        elif missing_ops([op], ext_dir):
            todo.append(op)
        else:
            out[op] = OpBuild(op, "cached")
    if todo:
        with _build_lock(ext_dir):
            for op in todo:
                out[op] = _build_one(op, env, ext_dir)
                if out[op].outcome == "failed":
                    _FAILED[(str(ext_dir), op)] = out[op]
    return [out[op] for op in ops]


def _build_one(op: str, env: dict[str, str], ext_dir: Path) -> OpBuild:
    """One op, under the host's build lock: cached meanwhile (another runner built it), else ``python -m trials.ops``
    in its own session, killed at BUILD_TIMEOUT_S."""
    if not missing_ops([op], ext_dir):
        return OpBuild(op, "cached")
    _await_baton(ext_dir / OP_LIBS[op] / "lock")
    if not missing_ops([op], ext_dir):
        return OpBuild(op, "cached")  # the other builder finished it
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "trials.ops", op],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, _ = proc.communicate(timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        (ext_dir / OP_LIBS[op] / "lock").unlink(missing_ok=True)  # torch's FileBaton of the build we killed
        return OpBuild(op, "failed", f"the build ran past {BUILD_TIMEOUT_S:.0f} s and was killed", BUILD_TIMEOUT_S)
    return _reported(op, stdout, proc.returncode, time.monotonic() - start, ext_dir)


def baton_stale(lock: Path, now: float) -> bool | None:
    """torch's build lock at ``lock``: None when there is none, True when it is older than ``LOCK_STALE_S`` (its
    builder died), False while a build may still hold it."""
    try:
        age = now - lock.stat().st_mtime
    except FileNotFoundError:
        return None
    return age > LOCK_STALE_S


def _await_baton(lock: Path, poll_s: float = 1.0) -> None:
    """Waits while another builder holds torch's lock on this op; removes it once stale."""
    while (held := baton_stale(lock, time.time())) is False:
        time.sleep(poll_s)
    if held:
        lock.unlink(missing_ok=True)


def _reported(op: str, stdout: str, code: int, seconds: float, ext_dir: Path) -> OpBuild:
    """The build's own line (the last JSON line of its stdout: DeepSpeed prints its warnings there too), checked
    against the cache: "built" only when the library is there for a probe to load."""
    said: dict[str, object] = {}
    for line in reversed(stdout.splitlines()):
        with contextlib.suppress(ValueError):
            said = json.loads(line)
            break
    outcome = str(said.get("outcome", "failed"))
    reason = str(said.get("reason") or f"the build process exited {code} without a word")
    if outcome == "built" and missing_ops([op], ext_dir):
        return OpBuild(op, "failed", "built, but no library is in the op cache for a probe to load", seconds)
    if outcome in ("built", "not-needed"):
        return OpBuild(op, outcome, "" if outcome == "built" else reason, seconds)  # type: ignore[arg-type]
    return OpBuild(op, "failed", reason, seconds)
