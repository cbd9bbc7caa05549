"""Several workers, as a team runs them: one API, a study created over HTTP, and two copies of docker-compose.yml's
worker command joining it at once on the real PostgreSQL. Every trial is recorded once, no config is probed twice,
both workers stop at the budget, and the API serves the same best config as the CLI and the stored rows select."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import time
from collections import Counter

import httpx
import pytest
from test_service import COMPOSE_ENV, SPACE, TOKEN, start_api

from tests.helpers.composefile import local_process
from tests.helpers.servers import TUNER_BIN, stop
from tuner.search.selection import best_stable
from tuner.storage import Store

STUDY = "e2e-workers"
BUDGET_S = 60
ENV = {**COMPOSE_ENV, "TUNER_STUDY": STUDY, "TUNER_BUDGET": f"{BUDGET_S}s"}
STOP_SLACK_S = 20  # process start-up and the final summary, outside the search's own clock


def _utc(value: dt.datetime) -> dt.datetime:
    return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)


@pytest.mark.slow
@pytest.mark.postgres
def test_two_workers_share_one_study_behind_the_api(tmp_path, new_postgres_url) -> None:
    url = new_postgres_url()
    argv, env = local_process("migrate", url, ENV)
    migrated = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert migrated.returncode == 0, migrated.stderr
    api, base = start_api(url, open(tmp_path / "api.log", "w"))
    workers: list[subprocess.Popen] = []
    try:
        http = httpx.Client(base_url=base, timeout=30)
        r = http.post(
            "/studies",
            headers={"Authorization": f"Bearer {TOKEN}"},
            json={
                "name": STUDY,
                "model": "builtin:tiny-t5",
                "world_size": 1,
                "global_batch": 8,
                "space": SPACE,
                "budget_s": BUDGET_S,
            },
        )
        assert r.status_code == 201, r.text

        argv, env = local_process("worker", url, ENV)
        for i in range(2):
            log = open(tmp_path / f"worker{i}.log", "w")
            workers.append(
                subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            )
        codes = []
        while any(w.poll() is None for w in workers):
            codes += [http.get(f"/studies/{STUDY}").status_code, http.get(f"/studies/{STUDY}/trials").status_code]
            time.sleep(0.5)
        for i, w in enumerate(workers):
            assert w.returncode == 0, (tmp_path / f"worker{i}.log").read_text()[-3000:]
        assert set(codes) == {200}

        store = Store(url)
        rows = store.probes(STUDY)
        measured = Counter((r.config_key, r.fidelity) for r in rows if r.fidelity != "inferred")
        assert measured and max(measured.values()) == 1, f"a config was probed twice: {measured}"
        first_rows = Counter(r.trial_number for r in rows if r.fidelity != "confirm")
        assert max(first_rows.values()) == 1, f"a trial was recorded twice: {first_rows}"

        runs = store.runs(STUDY)
        assert len(runs) == 2 and len({r.worker for r in runs}) == 2  # two processes, one run each
        for run in runs:  # both stop at the budget: no probe ran past a worker's deadline
            assert run.status == "finished", run
            assert run.budget_s == BUDGET_S
            assert run.finished_at is not None
            assert _utc(run.finished_at) <= _utc(run.started_at) + dt.timedelta(seconds=BUDGET_S + STOP_SLACK_S)
        assert {r.run_id for r in rows if r.fidelity != "inferred"} <= {r.id for r in runs}

        study = http.get(f"/studies/{STUDY}").json()
        assert study["status"] == "finished"
        assert study["progress"]["probes"] == len(rows)
        assert all(t["state"] != "RUNNING" for t in http.get(f"/studies/{STUDY}/trials?limit=500").json()["trials"])

        served = http.get("/best-config", params={"study": STUDY})
        assert served.status_code == 200, served.text
        expected = best_stable(rows)
        assert served.json()["config_key"] == expected.config_key
        assert served.json()["trial_number"] == expected.trial_number
        cli = subprocess.run(
            [TUNER_BIN, "best", "--study", STUDY, "--format", "deepspeed"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert cli.returncode == 0, cli.stderr
        raw = http.get("/best-config", params={"study": STUDY, "format": "deepspeed", "raw": "1"}).text
        assert json.loads(cli.stdout) == json.loads(raw)
    finally:
        for w in workers:
            if w.poll() is None:
                stop(w)
        stop(api)
