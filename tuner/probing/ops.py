"""DeepSpeed JIT ops a probe needs, compiled once before any probe's clock starts (``python -m trials.ops``).

A first-use compile costs 25-40 s on an idle machine, minutes on a busy one: inside a probe it eats the timeout, and
a probe killed mid-build leaves torch's build lock behind so every later load waits on it. Builds are serialised
across runner processes with an flock; a build this runner had to kill has its stale lock removed. A library ninja
would rebuild (sources newer than it: a reinstalled venv) counts as missing, so it is rebuilt here too.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from trials.contract import OP_LIBRARIES as OP_LIBS
from trials.contract import ProbeConfig
from tuner.probing import gpus

BUILD_TIMEOUT_S = 1800.0


_ADAM_TYPES = {"adam", "adamw"}


def needed_ops(config: ProbeConfig, gpu_host: bool) -> list[str]:
    """The JIT ops a probe of ``config`` loads: cpu_adam for an offloaded optimizer; on a GPU host, fused_adam for the
    user's Adam/AdamW optimizer section on the device (DeepSpeed's FusedAdam); on a host without GPUs, shm_comm
    (DeepSpeed's CPU accelerator loads it in init_distributed; its CUDA accelerator never builds it)."""
    knobs = config.knobs
    if knobs.engine != "deepspeed":
        return []
    optimizer = (config.deepspeed or {}).get("optimizer") or {}
    adam = str(optimizer.get("type", "")).lower() in _ADAM_TYPES
    torch_adam = bool((optimizer.get("params") or {}).get("torch_adam"))
    ops = ["cpu_adam"] if knobs.offload_optimizer else []
    if gpu_host and adam and not knobs.offload_optimizer and not torch_adam:
        ops.append("fused_adam")
    if not gpu_host:
        ops.append("shm_comm")
    return ops


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


def ensure_ops(config: ProbeConfig, env: dict[str, str]) -> list[str]:
    """Builds the ops ``config`` needs on this host (``needed_ops``: a GPU host is one with visible NVIDIA devices)
    that are not in the cache yet; returns the ones built (best effort: a failed build is left for the probe to report
    as its own error)."""
    return build_ops(needed_ops(config, gpus.has_visible_gpus(env)), env)


def build_ops(ops: list[str], env: dict[str, str]) -> list[str]:
    """Builds those of ``ops`` not in the cache yet, one build at a time across this host's runners; returns the ones
    built."""
    ext_dir = Path(env["TORCH_EXTENSIONS_DIR"])
    todo = missing_ops(ops, ext_dir)
    if not todo:
        return []
    with _build_lock(ext_dir):
        todo = missing_ops(todo, ext_dir)  # another runner may have built them while we waited
        if not todo:
            return []
        for op in todo:  # a lock left by a build that died (runner killed from outside): under our flock, stale
            (ext_dir / OP_LIBS[op] / "lock").unlink(missing_ok=True)
        proc = subprocess.Popen(
            [sys.executable, "-m", "trials.ops", *todo],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            proc.wait(BUILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            for op in todo:  # torch's FileBaton of the build we killed: nobody else builds under our flock
                (ext_dir / OP_LIBS[op] / "lock").unlink(missing_ok=True)
    return [op for op in todo if op not in missing_ops(todo, ext_dir)]
