"""`tuner serve` through the real entry point: loopback by default, refuses a public bind without a token, fails fast
on an unreachable storage, serves real HTTP, stops cleanly on SIGTERM."""

from __future__ import annotations

import re
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


def test_a_loopback_server_refuses_foreign_host_names_and_serves_its_docs_without_a_cdn(sqlite_url) -> None:
    """DNS rebinding: a page on evil.example re-pointed at 127.0.0.1 sends ``Host: evil.example``; the loopback server
    answers only the loopback names (issue 24 §6). /docs loads Swagger UI from the server itself (air-gapped hosts)."""
    populate(sqlite_url, "demo")
    proc, base = start_server(sqlite_url)
    port = base.rsplit(":", 1)[1]
    try:
        for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example", ""):
            r = httpx.get(f"{base}/best-config", params={"study": "demo"}, headers={"Host": host})
            assert r.status_code == 400 and "--allowed-hosts" in r.json()["detail"], (host, r.text)
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST", f"[::1]:{port}"):
            r = httpx.get(f"{base}/best-config", params={"study": "demo"}, headers={"Host": host})
            assert r.status_code == 200, (host, r.text)
        page = httpx.get(f"{base}/docs").text
        assets = re.findall(r"(?:src|href)=[\"']([^\"']+)", page)
        assert assets and not [a for a in assets if "://" in a], assets  # nothing from another host
        js = httpx.get(base + next(a for a in assets if a.endswith("swagger-ui-bundle.js")))
        assert js.status_code == 200 and len(js.content) > 500_000 and b"SwaggerUIBundle" in js.content
        assert httpx.get(f"{base}/openapi.json").json()["info"]["title"] == "tuner"
    finally:
        stop(proc)


def test_allowed_hosts_names_the_hosts_a_public_bind_answers(sqlite_url, tuner_server) -> None:
    populate(sqlite_url, "demo")
    base = tuner_server(
        sqlite_url,
        "--host",
        "0.0.0.0",
        "--allowed-hosts",
        "tuner.internal,*.corp.example,127.0.0.1",
        env={"TUNER_API_TOKEN": "tok"},
    )
    answered = {
        h: httpx.get(f"{base}/health", headers={"Host": h}).status_code
        for h in ("tuner.internal", "gpu1.corp.example:8000", "127.0.0.1", "corp.example", "evil.example")
    }
    assert answered == {
        "tuner.internal": 200,
        "gpu1.corp.example:8000": 200,
        "127.0.0.1": 200,
        "corp.example": 400,
        "evil.example": 400,
    }


def test_a_bad_allowed_hosts_list_is_one_line() -> None:
    """Each bad entry's wording is tests/tuner/test_hosts.py's; here the option and the variable reach it."""
    out = _run("--allowed-hosts", "a.example,http://b.example")
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "a.example,http://b.example" in out.stderr, out.stderr
    out = _run(env={"TUNER_ALLOWED_HOSTS": "a/b"})
    assert out.returncode == 2 and "TUNER_ALLOWED_HOSTS" in out.stderr and out.stderr.count("\n") == 1, out.stderr
