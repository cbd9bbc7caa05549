"""A preloaded fork server for probe ranks: ``python -m trials.forkserver --socket PATH``.

It imports the training stack once (torch, transformers' T5 / auto classes, DeepSpeed, the probe) and forks one child
per probe rank, so a probe skips the seconds of imports a fresh ``python -m trials`` pays. Each child:

* gets its own process group (``setpgid`` from both sides of the fork: no window in which a group kill misses it),
* gets the request's environment, working directory and stdout/stderr files, and the thread count of its
  OMP_NUM_THREADS (libgomp read the server's at load time),
* runs exactly what ``python -m trials`` runs (``trials.probe.run_probe_rank``) and ``os._exit``s with its code.

Protocol (one Unix stream connection per rank, one JSON line each way): the client sends
``{"config", "out", "env", "cwd", "stdout", "stderr"}``; the server answers ``{"pid": P}`` at once and
``{"pid": P, "returncode": RC}`` when the child ends (RC as ``subprocess``: negative = killed by that signal).
The server never runs a torch op itself (a fork after OpenMP or CUDA started is unsafe) and exits, killing its
children's groups, when its stdin closes (the runner that started it is gone). On a GPU host it is a zygote: started
with PYTORCH_NVML_BASED_CUDA_CHECK=1, it refuses to serve when its imports initialised CUDA (``cuda_initialised``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import selectors
import signal
import socket
import sys
import traceback
from pathlib import Path
from typing import Any

from trials.contract import ALLOC_CONF_ENV, EXIT_ERROR, FORKSERVER_READY, PRELOAD_OPS_ENV

# the allocator settings of the server's own environment: what torch parsed at import, in force in every fork
_SERVER_ALLOC_ENV = {name: os.environ.get(name, "") for name in ALLOC_CONF_ENV}


def preload() -> None:
    """Imports what every probe needs. Import only: no tensor op, no CUDA call."""
    import torch  # noqa: F401
    import transformers
    import transformers.generation.utils  # noqa: F401  (eval + generate probes)
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM  # noqa: F401
    from transformers.models.t5 import modeling_t5  # noqa: F401

    import trials.probe  # noqa: F401

    try:
        import deepspeed
        import deepspeed.runtime.engine

        # deepspeed.initialize's optimizer sanity check imports the Muon optimizer, whose torch.compile decorators
        # import torch._inductor: 5-7 s of every DeepSpeed probe's setup, paid here once
        import deepspeed.runtime.zero.muon.muon_optimizer
        import deepspeed.runtime.zero.stage3
        import deepspeed.runtime.zero.stage_1_and_2  # noqa: F401
        from deepspeed.ops.adam import DeepSpeedCPUAdam  # noqa: F401
    except ImportError:
        return
    preload_ops(os.environ.get(PRELOAD_OPS_ENV, ""))


def preload_ops(keys: str) -> list[str]:
    """Loads the built DeepSpeed ops named (``PRELOAD_OPS_ENV``: the runner lists those already in the op cache, so
    nothing is compiled here); a forked rank then finds each loaded. An op that fails to load is left to the rank,
    which reports it. Returns the ops loaded."""
    from deepspeed.accelerator import get_accelerator

    from trials.ops import OPS

    loaded = []
    for key in filter(None, keys.split(",")):
        try:
            builder = get_accelerator().create_op_builder(OPS[key])
            if builder is not None:
                builder.load(verbose=False)
                loaded.append(key)
        except Exception:  # the rank's own load says why, with its result
            continue
    return loaded


def _child(request: dict[str, Any], close: list[socket.socket]) -> int:
    for s in close:
        s.close()
    os.setpgid(0, 0)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, key in ((1, "stdout"), (2, "stderr")):
        target = os.open(request[key], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    enter_request(request["env"], request["cwd"])
    from trials.contract import LAUNCH_ENV, ProbeConfig
    from trials.probe import run_probe_rank

    config = ProbeConfig.model_validate_json(Path(request["config"]).read_text())
    launch = os.environ.get(LAUNCH_ENV)
    return run_probe_rank(config, Path(request["out"]), float(launch) if launch else None)


def enter_request(env: dict[str, str], cwd: str) -> None:
    """In a forked rank, before any probe code: the request's environment and working directory, and what the
    server's imports fixed from its own environment that the rank's must decide instead (the thread count)."""
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    import torch

    threads = os.environ.get("OMP_NUM_THREADS")
    if threads and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))
    apply_allocator_settings()
    apply_hub_offline()


def apply_allocator_settings() -> str:
    """The caching allocator's settings of the rank's environment (the alloc_conf knob), put in force before any CUDA
    call: torch parsed the server's at import and a fork keeps them. torch >= 2.9 changes them at run time
    (``_accelerator_setAllocatorSettings``); torch 2.11 has that setter but no getter, so what is in force is the
    server's own (its import parsed them and nothing in the server changes them). The string set goes from those to
    the asked ones (trials.alloc_settings.switch: a key the server named and the rank does not is set back to torch's
    default). Where this torch cannot change them (torch < 2.9), the rank's environment is set back to the server's,
    so that its fingerprint records what was in force, not what was asked. Returns the settings in force."""
    import torch

    from trials import alloc_settings
    from trials.contract import ALLOC_CONF_ENV, alloc_conf_in_force

    asked = alloc_conf_in_force(os.environ) or ""
    server = alloc_conf_in_force(_SERVER_ALLOC_ENV) or ""
    setter = alloc_settings.setter(torch._C)
    if setter is not None:
        getter = alloc_settings.getter(torch._C)
        in_force = getter() if getter is not None else server
        if asked != in_force:
            setter(alloc_settings.switch(in_force, asked))
        return asked
    for name in ALLOC_CONF_ENV:
        os.environ.pop(name, None)
        if _SERVER_ALLOC_ENV.get(name):
            os.environ[name] = _SERVER_ALLOC_ENV[name]
    return server


def apply_hub_offline() -> None:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) of the rank's environment in force: huggingface_hub fixed its constant
    at import, in the server, so a rank on a firewalled host would otherwise wait out the HTTP timeout."""
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is None:
        return
    offline = (os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or "").upper()
    constants.HF_HUB_OFFLINE = offline in {"1", "ON", "YES", "TRUE"}  # type: ignore[attr-defined]


def _send(conn: socket.socket, message: dict[str, Any]) -> None:
    try:
        conn.sendall((json.dumps(message) + "\n").encode())
    except OSError:
        pass  # the client went away; the child still runs to its end and is reaped


def _read_request(conn: socket.socket) -> dict[str, Any]:
    conn.settimeout(10)
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    return json.loads(data)


def cuda_initialised() -> bool:
    """Whether the preload initialised CUDA in this process (then no child may be forked from it)."""
    import torch

    return bool(torch.cuda.is_initialized())


def serve(path: Path) -> int:
    preload()
    if cuda_initialised():
        print("trials.forkserver: the imports initialised CUDA; a fork would break it: not serving", flush=True)
        return EXIT_ERROR
    path.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(64)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(sys.stdin.fileno(), selectors.EVENT_READ, "parent")
    children: dict[int, socket.socket] = {}
    print(FORKSERVER_READY, flush=True)
    null = os.open(os.devnull, os.O_WRONLY)  # nobody reads the server's output from here on: never block on it
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.close(null)
    try:
        while True:
            for key, _ in sel.select(timeout=0.05):
                if key.data == "parent":
                    if not os.read(sys.stdin.fileno(), 4096):
                        return 0  # the runner is gone
                    continue
                _accept(listener, children)
            _reap(children)
    finally:
        for pid in children:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        path.unlink(missing_ok=True)


def _accept(listener: socket.socket, children: dict[int, socket.socket]) -> None:
    """One rank's request: read it, fork the rank, answer its pid (the connection then waits for its exit status)."""
    conn, _ = listener.accept()
    try:
        request = _read_request(conn)
    except (OSError, ValueError) as exc:
        _send(conn, {"error": f"bad request: {exc}"})
        conn.close()
        return
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child
        code = EXIT_ERROR
        try:
            code = _child(request, [listener, conn, *children.values()])
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    try:
        os.setpgid(pid, pid)
    except (PermissionError, ProcessLookupError):
        pass  # the child already did it (or is gone and will be reaped)
    children[pid] = conn
    _send(conn, {"pid": pid})


def _reap(children: dict[int, socket.socket]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is not None:
            _send(conn, {"pid": pid, "returncode": os.waitstatus_to_exitcode(status)})
            conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trials.forkserver")
    parser.add_argument("--socket", type=Path, required=True)
    args = parser.parse_args(argv)
    return serve(args.socket)


if __name__ == "__main__":
    sys.exit(main())
