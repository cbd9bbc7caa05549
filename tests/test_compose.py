"""docker-compose.yml and the Dockerfile: postgres + migrate + api + worker (with a GPU reservation); every service
command is one the real tuner CLI accepts. No docker engine here: the e2e tests run the same commands locally."""

from __future__ import annotations

import re

import pytest

from tests.helpers.composefile import DOCKERFILE, ComposeError, command, interpolate, load, parse_cli, with_option
from tuner.hosts import host_allowed, parse_allowed_hosts

ENV = {"TUNER_API_TOKEN": "t0ken", "TUNER_MAX_LENGTH": "512"}


def test_services_and_their_wiring() -> None:
    compose = load(ENV)
    services = compose["services"]
    assert set(services) == {"postgres", "migrate", "api", "worker"}
    assert services["postgres"]["image"].startswith("postgres:")
    assert "healthcheck" in services["postgres"]
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in ("api", "worker"):
        assert services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        storage = services[name]["environment"]["TUNER_STORAGE"]
        assert storage.startswith("postgresql+psycopg://") and "@postgres:5432/" in storage
    assert services["api"]["ports"] == ["127.0.0.1:8000:8000"]
    # the API answers the Host names the published port and its own healthcheck use, and no other by default
    allowed = parse_allowed_hosts(services["api"]["environment"]["TUNER_ALLOWED_HOSTS"])
    probe = re.search(r"http://([^/]+)/health", " ".join(services["api"]["healthcheck"]["test"]))
    assert probe and host_allowed(probe.group(1), allowed) and host_allowed("localhost:8000", allowed)
    assert not host_allowed("evil.example", allowed)


def test_worker_reserves_gpus() -> None:
    worker = load(ENV)["services"]["worker"]
    devices = worker["deploy"]["resources"]["reservations"]["devices"]
    assert devices and devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    assert "deploy" not in load(ENV)["services"]["api"]  # the API needs no GPU (and never imports torch)


@pytest.mark.parametrize(
    "service, path",
    [("migrate", ["db", "upgrade"]), ("api", ["serve"]), ("worker", ["search"])],
)
def test_each_service_command_is_accepted_by_the_cli(service, path) -> None:
    argv = command(load(ENV)["services"][service])
    parsed_path, params = parse_cli(argv)
    assert parsed_path == path
    if service == "api":
        assert params["host"] == "0.0.0.0" and params["port"] == 8000
    if service == "worker":
        assert params["study"] == "flan-t5-large"
        assert params["model"] == "google/flan-t5-large" and params["max_length"] == 512


def test_worker_settings_come_from_the_environment() -> None:
    env = {**ENV, "TUNER_STUDY": "s1", "TUNER_MODEL": "builtin:tiny-t5", "TUNER_BUDGET": "90s", "TUNER_WORLD_SIZE": "2"}
    _, params = parse_cli(command(load(env)["services"]["worker"]))
    assert params["study"] == "s1" and params["model"] == "builtin:tiny-t5"
    assert params["world_size"] == 2


def test_the_parser_rejects_what_the_cli_rejects() -> None:
    argv = command(load(ENV)["services"]["api"])
    with pytest.raises(Exception, match="No such option"):
        parse_cli([*argv, "--workers", "4"])
    with pytest.raises(Exception, match="65535"):
        parse_cli(with_option(argv, "--port", "99999"))


def test_api_refuses_to_come_up_without_a_token() -> None:
    with pytest.raises(ComposeError, match="TUNER_API_TOKEN"):
        load({"TUNER_MAX_LENGTH": "512"})


def test_the_worker_needs_the_jobs_length() -> None:
    with pytest.raises(ComposeError, match="TUNER_MAX_LENGTH"):
        load({"TUNER_API_TOKEN": "t0ken"})


def test_interpolation_follows_compose_rules() -> None:
    assert interpolate("${A:-x}-${B-y}-$${C}", {"B": ""}) == "x--${C}"
    assert interpolate("${A}", {"A": "1"}) == "1"
    with pytest.raises(ComposeError, match="need it"):
        interpolate("${A:?need it}", {"A": ""})


def test_dockerfile_copies_every_package_and_runs_the_cli() -> None:
    text = DOCKERFILE.read_text()
    root = DOCKERFILE.parent
    copied = [src for line in text.splitlines() if line.startswith("COPY ") for src in line.split()[1:-1]]
    for src in copied:
        assert (root / src).exists(), f"Dockerfile copies {src}, which the repository lacks"
    assert {"tuner", "trials", "api", "pyproject.toml"} <= set(copied)
    assert re.search(r"^RUN pip install \.", text, re.M)
    cmd = re.search(r'^CMD \["tuner", "--help"\]', text, re.M)
    assert cmd is not None
    assert "USER tuner" in text
