"""The team setup end to end on the real PostgreSQL, with the commands of docker-compose.yml run as local processes:
`tuner db upgrade` (migrate), `tuner serve` (api, uvicorn), a study created over HTTP with the token, then the worker's
`tuner search` joining it while a real HTTP client reads the API; finally the served best config matches the CLI's."""

from __future__ import annotations

import json
import subprocess
import time

import httpx
import pytest

from tests.helpers.composefile import local_process, with_option
from tests.helpers.servers import TUNER_BIN, free_port, stop, wait_http

TOKEN = "e2e-token"
STUDY = "e2e-service"
BUDGET = "75s"
# plain-torch probes of the tiny T5 at a short length: seconds each, so the budget holds several
SPACE = {
    "micro_batch_size": [1, 2, 4, 8],
    "max_length": [32],
    "engine": ["torch"],
    "zero_stage": [0],
    "allgather_bucket_size": [None],
    "reduce_bucket_size": [None],
    "overlap_comm": [False],
    "offload_optimizer": [False],
    "gradient_checkpointing": [False, True],
}
COMPOSE_ENV = {
    "TUNER_API_TOKEN": TOKEN,
    "TUNER_STUDY": STUDY,
    "TUNER_MODEL": "builtin:tiny-t5",
    "TUNER_BUDGET": BUDGET,
    "TUNER_WORLD_SIZE": "1",
    "TUNER_GLOBAL_BATCH": "8",
    "TUNER_MAX_LENGTH": "32",  # the job of the study the API defines (SPACE: max_length 32)
}


def start_api(url: str, log) -> tuple[subprocess.Popen, str]:
    argv, env = local_process("api", url, COMPOSE_ENV)
    port = free_port()
    proc = subprocess.Popen(
        with_option(argv, "--port", str(port)), env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    base = f"http://127.0.0.1:{port}"
    wait_http(base + "/health", proc)
    return proc, base


@pytest.mark.slow
@pytest.mark.postgres
def test_serve_while_a_search_writes_on_postgres(tmp_path, new_postgres_url) -> None:
    url = new_postgres_url()
    argv, env = local_process("migrate", url, COMPOSE_ENV)
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr

    api_log = open(tmp_path / "api.log", "w")
    api, base = start_api(url, api_log)
    worker = None
    try:
        http = httpx.Client(base_url=base, timeout=30)
        created = http.post(
            "/studies",
            headers={"Authorization": f"Bearer {TOKEN}"},
            json={
                "name": STUDY,
                "model": "builtin:tiny-t5",
                "world_size": 1,
                "global_batch": 8,
                "space": SPACE,
                "budget_s": 75,
            },
        )
        assert created.status_code == 201, created.text
        assert http.get(f"/studies/{STUDY}").json()["status"] == "defined"

        argv, env = local_process("worker", url, COMPOSE_ENV)
        worker_log = open(tmp_path / "worker.log", "w")
        worker = subprocess.Popen(argv, env=env, stdout=worker_log, stderr=subprocess.STDOUT, start_new_session=True)
        statuses, trial_counts, codes = [], [], []
        while worker.poll() is None:  # a real client reading while the search writes
            for path in (f"/studies/{STUDY}", f"/studies/{STUDY}/trials", f"/best-config?study={STUDY}", "/studies"):
                r = http.get(path)
                codes.append(r.status_code)
                if path == f"/studies/{STUDY}":
                    statuses.append(r.json()["status"])
                    trial_counts.append(r.json()["progress"]["trials"])
            time.sleep(0.5)
        log = (tmp_path / "worker.log").read_text()
        assert worker.returncode == 0, log[-3000:]

        assert "running" in statuses, statuses
        assert set(codes) <= {200, 404}, codes  # 404 only while no stable trial exists yet
        assert trial_counts == sorted(trial_counts) and trial_counts[-1] >= 1

        study = http.get(f"/studies/{STUDY}").json()
        assert study["status"] == "finished"
        assert study["runs"][0]["status"] == "finished"
        assert sum(study["trial_states"].values()) == study["progress"]["trials"]
        page = http.get(f"/studies/{STUDY}/trials", params={"limit": 500}).json()
        assert page["total"] == study["progress"]["trials"]
        assert all(t["state"] != "RUNNING" for t in page["trials"])
        assert any(t["state"] == "COMPLETE" and t["ranks"] and t["samples_per_s"] for t in page["trials"])

        best = http.get("/best-config", params={"study": STUDY})
        assert best.status_code == 200, best.text
        body = best.json()
        assert body["knobs"]["engine"] == "torch" and body["global_batch"] == 8
        assert body["versions"].get("torch") and body["fingerprint"]
        cli = subprocess.run(
            [TUNER_BIN, "best", "--study", STUDY, "--format", "deepspeed"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert cli.returncode == 0, cli.stderr
        served = http.get("/best-config", params={"study": STUDY, "format": "deepspeed", "raw": "1"}).text
        assert json.loads(cli.stdout) == json.loads(served)
    finally:
        if worker is not None and worker.poll() is None:
            stop(worker)
        stop(api)
