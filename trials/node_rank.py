"""``python -m trials.node_rank DIR``: one probe rank of a node, as torchrun starts it (its config ``DIR/probe.json``,
its result beside it; one positional argument: torchrun's own parser would take ``--logs`` for its ``--logs-specs``).

torchrun (one agent per node, tuner.probing.agent) starts this once per local rank; it starts the rank itself
(``python -m trials``, in its own session, dying with this process) and leaves, for the node's tuner worker (which is
not the rank's parent), what torchrun does not hand out:

* ``lrank<L>.pid``: the rank's pid (its process group), this process's pid and the global RANK torchrun gave it
  (c10d: node order is join order), written once the rank started;
* ``lrank<L>.exit``: the rank's return code (as ``subprocess``: negative = killed by that signal), and whether torchrun
  stopped it (SIGTERM to this process: a peer failed first, so its end says nothing of its own);
* the rank's stdout / stderr in ``lrank<L>.stdout`` / ``.stderr``, NCCL's log in ``lrank<L>.nccl``.

It exits as the rank did (a signal re-raised on itself), so torchrun sees the rank's own failure. No torch import.

With ``TUNER_FORKSERVER_SOCKET`` set (the node's worker runs the preloaded fork server, trials.forkserver), the rank is
forked from it instead of started as a fresh interpreter (its imports already done): this process asks for it with
torchrun's environment and waits for its return code on the same connection, as the one-host runner does.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from types import FrameType

from trials.__main__ import _die_with_parent
from trials.contract import EXIT_ERROR

FORKSERVER_ENV = "TUNER_FORKSERVER_SOCKET"


def rank_file(logs: Path, local_rank: int, kind: str) -> Path:
    """``lrank<L>.<kind>`` in a node's log folder (pid, exit, stdout, stderr, nccl)."""
    return logs / f"lrank{local_rank}.{kind}"


def _write(path: Path, data: dict[str, object]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


class _Forked:
    """A rank forked by the node's fork server: its pid at once, its return code when the server says it ended."""

    def __init__(self, conn: socket.socket, pid: int, rest: bytes) -> None:
        self.conn, self.pid, self.rest = conn, pid, rest

    def wait(self) -> int:
        data = self.rest
        while not data.endswith(b"\n"):
            chunk = self.conn.recv(4096)
            if not chunk:  # the server is gone (its worker died): so is the rank, killed with its group
                return EXIT_ERROR
            data += chunk
        return int(json.loads(data.splitlines()[-1])["returncode"])


def _forked(logs: Path, local: int, env: dict[str, str]) -> _Forked:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(env[FORKSERVER_ENV])
    request = {
        "config": str(logs / "probe.json"),
        "out": str(logs / "result.json"),
        "env": {k: v for k, v in env.items() if k != FORKSERVER_ENV},
        "cwd": str(logs),
        "stdout": str(rank_file(logs, local, "stdout")),
        "stderr": str(rank_file(logs, local, "stderr")),
    }
    conn.sendall((json.dumps(request) + "\n").encode())
    data = b""
    while b"\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            raise OSError("the probe fork server closed the connection")
        data += chunk
    first, rest = data.split(b"\n", 1)
    said = json.loads(first)
    if "pid" not in said:
        raise OSError(f"the probe fork server refused the rank: {said.get('error')}")
    return _Forked(conn, int(said["pid"]), rest)


def _spawned(logs: Path, local: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with open(rank_file(logs, local, "stdout"), "wb") as out, open(rank_file(logs, local, "stderr"), "wb") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "trials", "--config", str(logs / "probe.json"), "--out", str(logs / "result.json")],
            env=env,
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trials.node_rank", description="One probe rank under torchrun.")
    parser.add_argument("dir", type=Path, help="the node's folder: probe.json in, result files and logs out")
    logs = parser.parse_args(argv).dir
    _die_with_parent()  # torchrun's agent is gone: so is this rank
    local = int(os.environ.get("LOCAL_RANK", "0"))
    env = dict(os.environ, NCCL_DEBUG_FILE=str(rank_file(logs, local, "nccl")))
    stopped = False

    child: _Forked | subprocess.Popen[bytes] | None = None
    if env.get(FORKSERVER_ENV):
        try:
            child = _forked(logs, local, env)
        except OSError:  # the server is gone or refused: a fresh interpreter
            child = None
    if child is None:
        child = _spawned(logs, local, {k: v for k, v in env.items() if k != FORKSERVER_ENV})

    def stop(signum: int, _frame: FrameType | None) -> None:  # torchrun shuts its workers down (a peer failed)
        nonlocal stopped
        stopped = True
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    _write(rank_file(logs, local, "pid"), {"pid": child.pid, "wrapper": os.getpid(), "rank": os.environ["RANK"]})
    code = child.wait()
    _write(rank_file(logs, local, "exit"), {"returncode": code, "stopped": stopped})
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code if 0 <= code < 256 else EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
