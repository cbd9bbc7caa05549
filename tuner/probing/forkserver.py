"""The runner's side of ``trials.forkserver``: one preloaded server per runner process, started on first use.

``ForkServer.spawn`` returns a handle with Popen's ``pid`` / ``poll()`` / ``wait()`` / ``returncode``, so the runner
supervises forked ranks exactly like spawned ones (its own process group, SIGKILL of the group at timeout).
On a GPU host the server is a zygote that never initialises CUDA: it runs with PYTORCH_NVML_BASED_CUDA_CHECK=1 (torch's
availability checks then ask NVML, not the driver), forks before any CUDA call, and refuses to serve when its imports
initialised CUDA anyway (trials.forkserver); each forked rank creates its own context. A rank that still finds CUDA
unusable after the fork turns the server off for the rest of the process (``disable``: fresh interpreters).
"""

from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from trials.contract import EXIT_ERROR, FORKSERVER_READY, PRELOAD_OPS_ENV
from tuner.probing import gpus
from tuner.probing.ops import missing_ops, prepare_ops
from tuner.probing.tempdirs import owned_dir

# the zygote's environment: CUDA availability from NVML, so no import or check initialises the driver before a fork
ZYGOTE_ENV = {"PYTORCH_NVML_BASED_CUDA_CHECK": "1"}

START_TIMEOUT_S = 180.0
READY = FORKSERVER_READY.encode()


class ForkedRank:
    """A rank forked by the server; its exit status arrives on the connection."""

    def __init__(self, conn: socket.socket, pid: int) -> None:
        self.conn = conn
        self.pid = pid
        self.returncode: int | None = None
        self._buf = b""
        self._orphan = False

    def _take(self, timeout: float | None) -> None:
        if self.returncode is not None:
            return
        if self._orphan:  # the server died: the child's exit status is lost; report it once the child is gone
            if not pid_alive(self.pid):
                self.returncode = EXIT_ERROR  # its result file, if any, still decides
            elif timeout:
                time.sleep(min(timeout, 0.05))
            return
        ready, _, _ = select.select([self.conn], [], [], timeout)
        if not ready:
            return
        chunk = self.conn.recv(4096)
        if not chunk:
            self._orphan = True
            self.conn.close()
            return
        self._buf += chunk
        if self._buf.endswith(b"\n"):
            message = json.loads(self._buf.splitlines()[-1])
            self.returncode = int(message["returncode"])
            self.conn.close()

    def poll(self) -> int | None:
        self._take(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if left == 0.0:
                break
            self._take(0.5 if left is None else min(0.5, left))
        return self.returncode


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists (also when it belongs to another user)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ForkServer:
    def __init__(self, env: dict[str, str]) -> None:
        self.dir = owned_dir("tuner-fs-")  # named by this pid: a killed run's is swept (tuner.probing.tempdirs)
        self.path = self.dir / "s"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "trials.forkserver", "--socket", str(self.path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={**env, **ZYGOTE_ENV, PRELOAD_OPS_ENV: ",".join(built_ops(env))},
            start_new_session=True,
        )
        assert self.proc.stdout is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        line = b""
        while line.strip() != READY:  # imports may print first (DeepSpeed logs to stdout)
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.proc.stdout], [], [], max(0.0, left))
            line = self.proc.stdout.readline() if ready else b""
            if not line:
                self.close()
                raise OSError("the probe fork server did not start")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def spawn(self, request: dict[str, Any]) -> ForkedRank:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(str(self.path))
        conn.sendall((json.dumps(request) + "\n").encode())
        data = b""
        conn.settimeout(30)
        while not data.endswith(b"\n"):
            chunk = conn.recv(4096)
            if not chunk:
                raise OSError("the probe fork server closed the connection")
            data += chunk
        message = json.loads(data.splitlines()[0])
        if "pid" not in message:
            conn.close()
            raise OSError(f"the probe fork server refused the probe: {message.get('error')}")
        conn.setblocking(True)
        rank = ForkedRank(conn, int(message["pid"]))
        rest = data.split(b"\n", 1)[1]
        if rest:
            rank._buf = rest
            if rest.endswith(b"\n"):
                rank.returncode = int(json.loads(rest.splitlines()[-1])["returncode"])
        return rank

    def close(self) -> None:
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()  # the server kills its children's groups and exits
            except OSError:
                pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


_lock = threading.Lock()
_server: ForkServer | None = None
_disabled = False


def usable() -> bool:
    """True unless a forked rank showed the server cannot give its children CUDA (``disable``); ROCm hosts
    (/dev/kfd) spawn: the zygote's NVML check does not cover them."""
    return not _disabled and not Path("/dev/kfd").exists()


def disable() -> None:
    """No more forked ranks in this process (their parent had initialised CUDA): the server is closed."""
    global _disabled
    _disabled = True
    shutdown()


def built_ops(env: dict[str, str]) -> list[str]:
    """The ops any probe on this host may load that are in the op cache and current (the server loads them once)."""
    ext_dir = Path(env["TORCH_EXTENSIONS_DIR"])
    return [op for op in prepare_ops(gpus.has_visible_gpus(env)) if not missing_ops([op], ext_dir)]


def get_server(env: dict[str, str]) -> ForkServer:
    """The runner process's server, started on first use (and restarted if it died)."""
    global _server
    with _lock:
        if _server is None or not _server.alive():
            _server = ForkServer(env)
            atexit.register(_server.close)
        return _server


def shutdown() -> None:
    global _server
    with _lock:
        if _server is not None:
            _server.close()
            _server = None
