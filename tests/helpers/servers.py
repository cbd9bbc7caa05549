"""Helpers for tests that run real `tuner` processes: the entry point, free ports, waiting for HTTP, a clean env."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from trials.contract import free_port

__all__ = ["TUNER_BIN", "clean_env", "free_port", "one_rank_env", "start_server", "stop", "wait_http"]

TUNER_BIN = os.path.join(os.path.dirname(sys.executable), "tuner")


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without TUNER_* settings, plus ``extra``."""
    return {k: v for k, v in os.environ.items() if not k.startswith("TUNER_")} | (extra or {})


def one_rank_env(**extra: str) -> dict[str, str]:
    """This environment plus a one-rank process group (RANK ... MASTER_PORT on a free port): what the HF Trainer's
    DeepSpeed integration needs to run in a plain `python` process, no launcher.

    DeepSpeed JIT-compiles its ops (shm comm, cpu_adam) where TORCH_EXTENSIONS_DIR points: here the probes' own op
    cache (``Settings.torch_extensions_dir``), which the search before the run has just filled, and the venv's ninja
    first on PATH (another ninja invalidates that cache). Left at torch's default (~/.cache/torch_extensions) each such
    run compiled shm comm again, a minute or more on 2 cores, and again whenever another checkout's venv had been there.
    """
    from tuner.settings import load_settings

    group = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
    ops = {
        "TORCH_EXTENSIONS_DIR": str(load_settings().torch_extensions_dir),
        "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    return {**os.environ, **group, **ops, "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1", **extra}


def wait_http(url: str, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    """Polls ``url`` until it answers (any status); fails with the server's output if the process died first."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            pytest.fail(f"process exited with {proc.returncode}: {out[-2000:]}", pytrace=False)
        try:
            httpx.get(url, timeout=2.0)
            return
        except httpx.TransportError:
            time.sleep(0.1)
    pytest.fail(f"{url} did not answer within {timeout_s:.0f}s", pytrace=False)


def start_server(storage: str, *extra: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """Starts `tuner serve` on a free loopback port in its own session; returns (process, base URL) once it answers."""
    port = free_port()
    proc = subprocess.Popen(
        [TUNER_BIN, "serve", "--storage", storage, "--port", str(port), "--log-level", "warning", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=clean_env(env),
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(base + "/health", proc)
    except BaseException:
        stop(proc)
        raise
    return proc, base


def stop(proc: subprocess.Popen, timeout_s: float = 15.0) -> int:
    """SIGTERM, then SIGKILL to the whole process group if it lingers; returns the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return int(proc.returncode)
