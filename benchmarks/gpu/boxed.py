"""The GPU check's commands under time boxes (stdlib only): each in its own session, its stdout and stderr to files;
at its box SIGINT to its whole process group (a search stops and writes its summary), then SIGKILL after a grace.
A background command runs at the lowest CPU priority and is stopped the same way when its time is up."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

GRACE_S = 10.0  # between SIGINT and SIGKILL: a search's own shutdown (its ranks killed, its summary written)


@dataclass(frozen=True)
class Ran:
    """How a boxed command ended: ``rc`` its exit status (None: stopped at its box), ``seconds`` it took."""

    rc: int | None
    seconds: float
    box_s: float
    stdout: Path
    stderr: Path

    @property
    def timed_out(self) -> bool:
        return self.rc is None

    def out(self) -> str:
        return _read(self.stdout)

    def err(self) -> str:
        return _read(self.stderr)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _stop(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGINT to the group, SIGKILL after ``grace_s``."""
    _signal_group(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        _signal_group(proc.pid, signal.SIGKILL)
        proc.wait()


def _start(
    cmd: Sequence[str], env: Mapping[str, str], out: Path, cwd: Path | None, nice: bool
) -> subprocess.Popen[bytes]:
    stdout, stderr = open(out, "wb"), open(out.with_suffix(".err"), "wb")  # noqa: SIM115 (closed below)
    try:
        return subprocess.Popen(
            list(cmd),
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
            preexec_fn=(lambda: os.nice(19)) if nice else None,
        )
    finally:
        stdout.close()
        stderr.close()


def run_boxed(
    cmd: Sequence[str],
    box_s: float,
    env: Mapping[str, str],
    out: Path,
    cwd: Path | None = None,
    grace_s: float = GRACE_S,
) -> Ran:
    """Runs ``cmd`` for at most ``box_s`` seconds, its grace inside them (SIGINT at ``box_s`` less the grace, SIGKILL
    at ``box_s``; the grace at most a quarter of the box), stdout to ``out``, stderr beside it (``.err``); whatever
    it left running in its group is killed when it ends."""
    grace_s = min(grace_s, box_s / 4)
    start = time.monotonic()
    try:
        proc = _start(cmd, env, out, cwd, nice=False)
    except OSError as exc:
        out.with_suffix(".err").write_text(f"could not start {cmd[0]}: {exc}\n")
        return Ran(127, 0.0, box_s, out, out.with_suffix(".err"))
    rc: int | None
    try:
        rc = proc.wait(timeout=max(0.0, box_s - grace_s))
    except subprocess.TimeoutExpired:
        _stop(proc, grace_s)
        rc = None
    except BaseException:  # the check itself interrupted (SIGTERM, ^C): the step goes with it
        _signal_group(proc.pid, signal.SIGKILL)
        raise
    _signal_group(proc.pid, signal.SIGKILL)  # its stray children (a compile job, a fork server)
    return Ran(rc, time.monotonic() - start, box_s, out, out.with_suffix(".err"))


class Background:
    """A command started now at the lowest CPU priority (nice 19) beside the check's steps."""

    def __init__(self, name: str, cmd: Sequence[str], env: Mapping[str, str], out: Path, cwd: Path | None = None):
        self.name = name
        self.cmd = list(cmd)
        self.out = out
        self.start = time.monotonic()
        self.proc: subprocess.Popen[bytes] | None = None
        self.rc: int | None = None
        self.stopped = False
        try:
            self.proc = _start(cmd, env, out, cwd, nice=True)
        except OSError as exc:
            out.with_suffix(".err").write_text(f"could not start {cmd[0]}: {exc}\n")
            self.rc = 127

    def done(self) -> bool:
        if self.proc is not None and self.rc is None:
            self.rc = self.proc.poll()
        return self.rc is not None or self.stopped

    def wait(self, until: float) -> bool:
        """Waits until it ends or the monotonic time ``until``; True when it ended."""
        while not self.done() and time.monotonic() < until:
            time.sleep(0.5)
        return self.rc is not None

    def stop(self) -> None:
        """Stops it now (SIGINT, SIGKILL after a short grace) unless it ended."""
        if self.proc is not None and not self.done():
            _stop(self.proc, grace_s=2.0)
            self.stopped = True
        if self.proc is not None:
            _signal_group(self.proc.pid, signal.SIGKILL)

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.start

    def text(self) -> str:
        return _read(self.out)


__all__ = ["GRACE_S", "Background", "Ran", "run_boxed"]
