"""`tuner serve` through the real entry point: loopback by default, refuses a public bind without a token, fails fast
on an unreachable storage, serves real HTTP, stops cleanly on SIGTERM."""

from __future__ import annotations

import signal
import subprocess

import httpx

from tests.helpers.sample_storage import populate
from tests.helpers.servers import TUNER_BIN, clean_env, free_port, start_server, stop, wait_http


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([TUNER_BIN, "serve", *args], capture_output=True, text=True, env=clean_env(env), timeout=60)


def test_public_bind_without_token_is_refused_in_one_line(sqlite_url) -> None:
    for host in ("0.0.0.0", "::", "example.org"):
        out = _run("--storage", sqlite_url, "--host", host)
        assert out.returncode == 2, (host, out.stderr)
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and "TUNER_API_TOKEN" in lines[0], out.stderr


def test_unreachable_storage_fails_fast_in_one_line() -> None:
    out = _run(
        "--storage", f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/nothing", "--port", str(free_port())
    )
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "cannot reach storage" in out.stderr


def test_bad_port_is_a_usage_error() -> None:
    out = _run("--port", "70000")
    assert out.returncode == 2
    assert "--port" in out.stderr and out.stderr.count("\n") == 1


def test_serve_answers_real_http_on_loopback_without_loading_torch(sqlite_url) -> None:
    populate(sqlite_url, "demo")
    proc, base = start_server(sqlite_url)
    try:
        r = httpx.get(f"{base}/best-config", params={"study": "demo"})
        assert r.status_code == 200
        assert r.json()["trial_number"] == 2
        assert httpx.get(f"{base}/studies/demo/trials").json()["total"] == 8
        for fmt in ("deepspeed", "hf", "accelerate", "env"):
            httpx.get(f"{base}/best-config", params={"study": "demo", "format": fmt})
        with open(f"/proc/{proc.pid}/maps") as maps:  # the live server process: no torch library mapped
            assert "libtorch" not in maps.read()
    finally:
        stop(proc)


def test_public_bind_with_token_serves_and_checks_the_token(sqlite_url, tuner_server) -> None:
    base = tuner_server(sqlite_url, "--host", "0.0.0.0", env={"TUNER_API_TOKEN": "tok"})
    body = {"name": "via-http"}
    assert httpx.post(f"{base}/studies", json=body).status_code == 401
    r = httpx.post(f"{base}/studies", json=body, headers={"Authorization": "Bearer tok"})
    assert r.status_code == 201


def test_sigterm_stops_the_server_cleanly(sqlite_url) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [TUNER_BIN, "serve", "--storage", sqlite_url, "--port", str(port)],
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/health", proc)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=20)
        output = proc.stdout.read() if proc.stdout else ""
        # uvicorn shuts down gracefully, then re-raises the signal it caught (exit -SIGTERM), by design
        assert code in (0, -signal.SIGTERM), output
        assert "Finished server process" in output
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
