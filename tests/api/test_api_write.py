"""POST /studies behind the bearer token, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from trials.contract import ModelSpec
from tuner.search.request import SearchRequest, request_from_definition
from tuner.settings import Settings
from tuner.storage import Store

TOKEN = "s3cret-token-for-tests"  # the token of the `client` fixture in tests/api/conftest.py
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BODY = {
    "name": "team-a.flan_t5-large",
    "model": "google/flan-t5-large",
    "world_size": 4,
    "global_batch": 32,
    "device_memory": "80GiB",
    "headroom": 0.85,
    "budget_s": 7200,
    "space": {"zero_stage": [1, 2], "max_length": [512]},
}


def _any_request(url: str) -> SearchRequest:
    from tuner.job.objective import objective_for
    from tuner.job.space import default_space

    space = default_space()
    return SearchRequest(
        study_name="x",
        storage=url,
        model=ModelSpec(),
        space=space,
        world_size=1,
        global_batch=8,
        objective=objective_for(space.max_length),
        budget_s=60.0,
    )


@pytest.fixture
def app_client(storage_url: str) -> TestClient:
    """On SQLite and on PostgreSQL: for what depends on the storage."""
    return TestClient(create_app(Settings(storage=storage_url, api_token=TOKEN)))


@pytest.fixture
def quick_client(sqlite_url: str) -> tuple[TestClient, str]:
    """SQLite only: request validation and auth happen before any storage access."""
    return TestClient(create_app(Settings(storage=sqlite_url, api_token=TOKEN))), sqlite_url


def test_create_study_with_token_stores_a_definition_workers_read(app_client, storage_url) -> None:
    r = app_client.post("/studies", json=BODY, headers=AUTH)
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["name"] == BODY["name"] and body["status"] == "defined" and body["created_by"] == "api"
    stored = Store(storage_url).require_study(BODY["name"])  # what a `tuner search --study` worker reads
    assert stored["world_size"] == 4 and stored["global_batch"] == 32 and stored["headroom"] == 0.85
    assert stored["device_memory"] == 80 << 30 and stored["model"]["source"] == "google/flan-t5-large"
    assert stored["space"]["zero_stage"] == [1, 2]
    assert app_client.get(f"/studies/{BODY['name']}").json()["definition"] == stored
    # the worker side resumes from it exactly as from a study `tuner search` created itself
    request = request_from_definition(_any_request(storage_url), stored)
    assert request.world_size == 4 and request.global_batch == 32 and request.model.source == "google/flan-t5-large"
    assert request.definition()["space"] == stored["space"]


def test_duplicate_study_is_409(app_client) -> None:
    assert app_client.post("/studies", json=BODY, headers=AUTH).status_code == 201
    r = app_client.post("/studies", json={**BODY, "world_size": 1}, headers=AUTH)
    assert r.status_code == 409
    assert "already exists" in r.json()["detail"]


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": f"Bearer {TOKEN}x"},
        {"Authorization": "Bearer "},
    ],
)
def test_missing_or_wrong_token_is_401_and_writes_nothing(quick_client, headers) -> None:
    app_client, storage_url = quick_client
    r = app_client.post("/studies", json=BODY, headers=headers)
    assert r.status_code == 401
    assert r.headers["www-authenticate"] == "Bearer"
    assert "token" in r.json()["detail"]
    assert Store(storage_url).study_definition(BODY["name"]) is None


def test_server_without_token_refuses_writes(storage_url) -> None:
    client = TestClient(create_app(Settings(storage=storage_url, api_token=None)))
    r = client.post("/studies", json=BODY, headers=AUTH)
    assert r.status_code == 403
    assert "TUNER_API_TOKEN" in r.json()["detail"]
    assert Store(storage_url).study_definition(BODY["name"]) is None


@pytest.mark.parametrize(
    "patch",
    [
        {"name": "x" * 129},
        {"name": "no spaces"},
        {"name": ""},
        {"world_size": 0},
        {"headroom": 1.5},
        {"command": "rm -rf /"},
        {"space_file": "/etc/passwd"},
        {"global_batch": "lots"},
    ],
)
def test_invalid_definitions_are_422(quick_client, patch) -> None:
    app_client, _ = quick_client
    r = app_client.post("/studies", json={**BODY, **patch}, headers=AUTH)
    assert r.status_code == 422
    assert r.json()["detail"].startswith("invalid request")


@pytest.mark.parametrize(
    "patch, words",
    [
        ({"model": "/etc/passwd"}, "hub id"),
        ({"model": "../models/t5"}, "hub id"),
        ({"model": "builtin:nope"}, "nope"),
        ({"space": {"warp_drive": [1]}}, "warp_drive"),
        ({"space": {"micro_batch_size": []}}, "micro_batch_size"),
        ({"global_batch": 7}, "7"),
        ({"device_memory": "lots"}, "lots"),
        ({"space": {"allgather_bucket_size": 0}}, "allgather_bucket_size"),
        ({"space": {"engine": ["jax"]}}, "engine"),
    ],
)
def test_definitions_tuner_search_would_reject_are_400_and_store_nothing(quick_client, patch, words) -> None:
    app_client, storage_url = quick_client
    r = app_client.post("/studies", json={**BODY, **patch}, headers=AUTH)
    assert r.status_code == 400, r.text
    assert words in r.json()["detail"]
    assert Store(storage_url).study_definition(BODY["name"]) is None


def test_a_bare_space_value_is_one_choice(quick_client) -> None:
    app_client, storage_url = quick_client
    r = app_client.post(
        "/studies", json={"name": "bare", "space": {"reduce_bucket_size": 5e7, "max_length": 64}}, headers=AUTH
    )
    assert r.status_code == 201, r.text
    space = Store(storage_url).require_study("bare")["space"]
    assert space["reduce_bucket_size"] == [50_000_000] and space["max_length"] == [64]


def test_malformed_json_body_is_422(quick_client) -> None:
    app_client, _ = quick_client
    r = app_client.post("/studies", content=b"{not json", headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 422


def test_best_config_follows_new_probes_at_once(app_client, storage_url) -> None:
    """A search writing a better confirmed config changes the answer on the next request (no stale cache)."""
    from tests.helpers.sample_storage import SampleStudy, populate

    populate(storage_url, "live")
    first = app_client.get("/best-config", params={"study": "live"}).json()
    assert first["trial_number"] == 2
    sample = SampleStudy(storage_url, "live")
    row = sample.store.probes("live", fidelity="confirm")[0]
    for fidelity in ("short", "confirm"):
        better = {"objective": 10 * (row.objective or 0), "samples_per_s": 10 * (row.samples_per_s or 0)}
        sample.again(row, trial_number=9, config_key="better", fidelity=fidelity, **better)
    second = app_client.get("/best-config", params={"study": "live"}).json()
    assert second["trial_number"] == 9 and second["config_key"] == "better"
    assert app_client.get("/best-config", params={"study": "live", "format": "json"}).json()["trial_number"] == 9


DS_BASELINE = {
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 4,
    "train_batch_size": "auto",
    "zero_optimization": {
        "stage": 2,
        "overlap_comm": True,
        "allgather_bucket_size": 2e8,
        "reduce_bucket_size": 2e8,
        "offload_optimizer": {"device": "cpu"},
    },
    "gradient_clipping": 1.0,
    "optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
}
DS_PLAIN = {**DS_BASELINE, "train_batch_size": 32, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}
HF_ARGS = {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 4, "learning_rate": 1e-4}


def test_study_with_an_inline_baseline_probes_it_first(quick_client) -> None:
    app_client, storage_url = quick_client
    body = {"name": "with-baseline", "world_size": 4, "baseline": DS_BASELINE, "training_args": HF_ARGS}
    r = app_client.post("/studies", json=body, headers=AUTH)
    assert r.status_code == 201, r.text
    stored = Store(storage_url).require_study("with-baseline")
    assert stored["global_batch"] == 2 * 4 * 4  # from the baseline: micro x accum x world
    assert stored["baseline"]["zero_stage"] == 2 and stored["baseline"]["offload_optimizer"] is True
    assert stored["baseline_source"]["optimizer"]["type"] == "AdamW"  # kept for the deepspeed export


@pytest.mark.parametrize(
    "baseline, words",
    [
        ({**DS_PLAIN, "train_batch_size": 7}, "train_batch_size"),
        ({**DS_PLAIN, "zero_optimization": {"stage": 2, "warp": 1}}, "zero_optimization.warp"),
        (DS_BASELINE, "auto"),
    ],  # "auto" values with no training args to resolve them
)
def test_bad_baselines_are_400_naming_the_field(quick_client, baseline, words) -> None:
    app_client, storage_url = quick_client
    r = app_client.post("/studies", json={"name": "b", "world_size": 4, "baseline": baseline}, headers=AUTH)
    assert r.status_code == 400, r.text
    assert words in r.json()["detail"]
    assert Store(storage_url).study_definition("b") is None


def test_status_and_progress_follow_the_workers_heartbeats(app_client, storage_url) -> None:
    """running while a worker beats, with progress inside (0, 1); interrupted once its heartbeat is stale."""
    import datetime as dt

    import sqlalchemy as sa

    from tuner.storage.schema import search_runs

    store = Store(storage_url)
    store.ensure_study("hb", {"model": {"source": "builtin:tiny-t5"}, "world_size": 1, "budget_s": 600})
    now = dt.datetime.now(dt.timezone.utc)
    run = store.start_run("hb", "host:1", 600.0, now + dt.timedelta(seconds=540))
    with store.engine.begin() as conn:  # the run began a minute ago
        conn.execute(
            sa.update(search_runs).where(search_runs.c.id == run).values(started_at=now - dt.timedelta(seconds=60))
        )
    body = app_client.get("/studies/hb").json()
    assert body["status"] == "running"
    assert 0.05 < body["progress"]["fraction"] < 0.2 and body["progress"]["remaining_s"] > 400
    with store.engine.begin() as conn:  # the worker was killed: no heartbeat for 5 minutes
        conn.execute(
            sa.update(search_runs).where(search_runs.c.id == run).values(heartbeat_at=now - dt.timedelta(minutes=5))
        )
    assert app_client.get("/studies/hb").json()["status"] == "interrupted"
    store.heartbeat(run)
    assert app_client.get("/studies/hb").json()["status"] == "running"
    store.finish_run(run, "finished")
    body = app_client.get("/studies/hb").json()
    assert body["status"] == "finished" and body["progress"]["fraction"] == 1.0


def test_a_live_worker_reads_live_from_an_api_host_whose_clock_is_an_hour_off(
    app_client, storage_url, monkeypatch
) -> None:
    """Heartbeats are written on the database's clock; the API judges them on it too, not on its own wall clock
    (issue 13, point 12): a skewed API host must not report a beating worker as interrupted."""
    import datetime as dt

    real = dt.datetime

    class Skewed(dt.datetime):
        @classmethod
        def now(cls, tz=None):  # type: ignore[override]
            return real.now(tz) + dt.timedelta(hours=1)

    store = Store(storage_url)
    store.ensure_study("skew", {"model": {"source": "builtin:tiny-t5"}, "world_size": 1, "budget_s": 600})
    run = store.start_run("skew", "host:1", 600.0, real.now(dt.timezone.utc) + dt.timedelta(seconds=540))
    monkeypatch.setattr(dt, "datetime", Skewed)  # every datetime.now() in this process is an hour ahead
    assert app_client.get("/studies/skew").json()["status"] == "running"
    listed = {s["name"]: s["status"] for s in app_client.get("/studies").json()["studies"]}
    assert listed["skew"] == "running"
    store.finish_run(run, "finished")
    assert app_client.get("/studies/skew").json()["status"] == "finished"
