"""Issue 13, the API side: hostile or absurd definitions are refused with one 422 line naming the key and store
nothing; GET /best-config needs study= (unless the server has a default study); secrets in the storage URL never
leave the server. Real SQLite / PostgreSQL storage through the FastAPI app, as the other API tests."""

from __future__ import annotations

import json
import math

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from tests.helpers.sample_storage import BEST_TRIAL, populate
from tuner.settings import Settings
from tuner.storage import Store

TOKEN = "s3cret-token-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
DS = {
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 4,
    "train_batch_size": 8,
    "zero_optimization": {"stage": 2},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "betas": [0.9, 0.999], "eps": 1e-8}},
}
HF = {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 4, "learning_rate": 1e-4}


@pytest.fixture
def quick(sqlite_url: str) -> tuple[TestClient, str]:
    return TestClient(create_app(Settings(storage=sqlite_url, api_token=TOKEN)), raise_server_exceptions=False), (
        sqlite_url
    )


def _post(client: TestClient, body: dict) -> tuple[int, str]:
    r = client.post("/studies", json=body, headers=AUTH)
    detail = r.json()["detail"]
    assert isinstance(detail, str) and "\n" not in detail, r.text
    return r.status_code, detail


# (id, baseline DS patch or None, training args patch or None, the key the 422 names)
HOSTILE = [
    (
        "flops-profiler-file",
        {"flops_profiler": {"enabled": True, "output_file": "/etc/cron.d/x"}},
        None,
        "flops_profiler",
    ),
    ("tensorboard", {"tensorboard": {"enabled": True, "output_path": "/srv/tb", "job_name": "x"}}, None, "tensorboard"),
    ("wandb", {"wandb": {"enabled": True, "project": "evil"}}, None, "wandb"),
    ("csv-monitor", {"csv_monitor": {"enabled": True, "output_path": "/tmp/x"}}, None, "csv_monitor"),
    ("comet", {"comet": {"enabled": True}}, None, "comet"),
    ("comms-logger", {"comms_logger": {"enabled": True}}, None, "comms_logger"),
    ("autotuning", {"autotuning": {"enabled": True, "results_dir": "/x"}}, None, "autotuning"),
    ("monitor-config", {"monitor_config": {"enabled": True}}, None, "monitor_config"),
    ("nebula", {"nebula": {"enabled": True, "persistent_storage_path": "/x"}}, None, "nebula"),
    ("aio", {"aio": {"block_size": 1048576}}, None, "aio"),
    (
        "nvme-path",
        {"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "nvme_path": "/mnt/x"}}},
        None,
        "zero_optimization.offload_param.nvme_path",
    ),
    ("lr-1000", {"optimizer": {"type": "AdamW", "params": {"lr": 1000}}}, None, "optimizer.params.lr"),
    ("lr-zero", {"optimizer": {"type": "AdamW", "params": {"lr": 0}}}, None, "optimizer.params.lr"),
    ("lr-negative", {"optimizer": {"type": "AdamW", "params": {"lr": -0.1}}}, None, "optimizer.params.lr"),
    ("beta-above-1", {"optimizer": {"type": "AdamW", "params": {"betas": [0.9, 1.5]}}}, None, "betas.1"),
    (
        "warmup-max-lr",
        {"scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 50}}},
        None,
        "scheduler.params.warmup_max_lr",
    ),
    ("clip-huge", {"gradient_clipping": 1e300}, None, "gradient_clipping"),
    ("hf-output-dir", None, {"output_dir": "/etc"}, "training_args.output_dir"),
    ("hf-logging-dir", None, {"logging_dir": "/var/log/x"}, "training_args.logging_dir"),
    ("hf-report-to", None, {"report_to": ["wandb"]}, "training_args.report_to"),
    ("hf-push", None, {"push_to_hub": True, "hub_model_id": "evil/model"}, "training_args.push_to_hub"),
    ("hf-token", None, {"hub_token": "hf_abc"}, "training_args.hub_token"),
    ("hf-ds-path", None, {"deepspeed": "/etc/ds.json"}, "training_args.deepspeed"),
    (
        "hf-inline-ds-profiler",
        None,
        {"deepspeed": {**DS, "flops_profiler": {"enabled": True, "output_file": "/x"}}},
        "training_args.deepspeed.flops_profiler",
    ),
    ("hf-lr", None, {"learning_rate": 1000}, "training_args.learning_rate"),
]


@pytest.mark.parametrize("ds, hf, key", [h[1:] for h in HOSTILE], ids=[h[0] for h in HOSTILE])
def test_a_posted_baseline_with_host_acting_or_absurd_content_is_422_naming_the_key(quick, ds, hf, key) -> None:
    client, url = quick
    body: dict = {"name": "hostile", "world_size": 1}
    if ds is not None:
        body["baseline"] = {**DS, **ds}
    if hf is not None:
        body["training_args"] = {**HF, **hf}
    status, detail = _post(client, body)
    assert status == 422, detail
    assert key in detail, detail
    assert Store(url).study_definition("hostile") is None


def test_a_non_finite_number_in_a_posted_baseline_is_422(quick) -> None:
    """JSON parsers (Starlette's included) read NaN and Infinity; neither may reach a worker."""
    client, url = quick
    for bad in ("NaN", "Infinity"):
        raw = json.dumps({"name": "nan", "baseline": {**DS, "gradient_clipping": 1.0}}).replace("1.0", bad)
        r = client.post("/studies", content=raw, headers={**AUTH, "Content-Type": "application/json"})
        assert r.status_code == 422, r.text
        assert "gradient_clipping" in r.json()["detail"]
    assert Store(url).study_definition("nan") is None
    assert math.isnan(json.loads("NaN"))  # what the server would have read


def test_a_plain_posted_baseline_is_still_accepted(quick) -> None:
    client, url = quick
    body = {"name": "plain", "baseline": DS, "training_args": {**HF, "report_to": "none"}}
    r = client.post("/studies", json=body, headers=AUTH)
    assert r.status_code == 201, r.text
    assert Store(url).require_study("plain")["baseline_source"]["optimizer"]["params"]["lr"] == 1e-4


# -- limits at parse time (issue 13 point 5) ---------------------------------------------------------------------------
PRIMES = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61]
LIMITS = [
    (
        "intrange-1e18",
        {"space": {"micro_batch_size": {"low": 1, "high": 10**18, "scale": "linear"}}},
        "micro_batch_size",
    ),
    (
        "grid-1e10",
        {
            "space": {
                "micro_batch_size": list(range(1, 65)),
                "max_length": list(range(1, 65)),
                "alloc_conf": [f"max_split_size_mb:{i}" for i in range(1, 65)],
                "reduce_bucket_size": list(range(1, 65)),
            }
        },
        "configs",
    ),
    ("device-memory-1e400", {"device_memory": "1e400GiB"}, "device_memory"),
    ("device-memory-int-huge", {"device_memory": 10**30}, "device_memory"),
    ("device-memory-fraction", {"device_memory": "1.5B"}, "device_memory"),
    ("world-4096", {"world_size": 4096}, "world_size"),
    ("default-global-batch-lcm", {"space": {"micro_batch_size": PRIMES, "max_length": [64]}}, "global_batch"),
]


@pytest.mark.parametrize("patch, key", [c[1:] for c in LIMITS], ids=[c[0] for c in LIMITS])
def test_limits_are_checked_at_parse_time_with_422_naming_the_key(quick, patch, key) -> None:
    client, url = quick
    status, detail = _post(client, {"name": "big", **patch})
    assert status == 422, detail
    assert key in detail, detail
    assert Store(url).study_definition("big") is None


# -- GET /best-config needs study= (issue 13 point 4) ------------------------------------------------------------------
@pytest.fixture(scope="module")
def two_studies(tmp_path_factory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('best') / 'tuner.db'}"
    populate(url, "t5-demo")
    Store(url).ensure_study("posted-later", {"model": "builtin:tiny-t5", "world_size": 1})  # the newest study
    return url


def test_best_config_without_study_is_4xx_naming_study(two_studies) -> None:
    client = TestClient(create_app(Settings(storage=two_studies)))
    for params in ({}, {"format": "deepspeed", "raw": "true"}):
        r = client.get("/best-config", params=params)
        assert r.status_code == 422, r.text
        assert "study=" in r.json()["detail"]
    assert client.get("/best-config", params={"study": "t5-demo"}).json()["trial_number"] == BEST_TRIAL


def test_a_default_study_serves_best_config_without_study_and_a_new_post_does_not_take_over(two_studies) -> None:
    client = TestClient(create_app(Settings(storage=two_studies, default_study="t5-demo", api_token=TOKEN)))
    assert client.post("/studies", json={"name": "newest"}, headers=AUTH).status_code == 201
    body = client.get("/best-config").json()
    assert body["study"] == "t5-demo" and body["trial_number"] == BEST_TRIAL
    assert client.get("/best-config", params={"study": "newest"}).status_code == 404  # asked for, no stable trial


# -- secrets in the storage URL (issue 13 point 12) ------------------------------------------------------------------
SECRET = "hunter2-not-shown"


@pytest.mark.postgres
@pytest.mark.parametrize("form", ["userinfo", "query"])
def test_the_storage_password_is_never_in_health_or_503_bodies(new_postgres_url, form) -> None:
    base = new_postgres_url()  # trust auth: the password is accepted and ignored, so the server works with it
    url = (
        base.replace("postgresql+psycopg://postgres@", f"postgresql+psycopg://postgres:{SECRET}@")
        if form == "userinfo"
        else f"{base}?password={SECRET}"
    )
    assert SECRET in url
    r = TestClient(create_app(Settings(storage=url))).get("/health")
    assert r.status_code == 200, r.text
    assert SECRET not in r.text and r.json()["storage"] == f"postgresql+psycopg database {base.rsplit('/', 1)[1]}"
    down = url.replace(":5432/", ":9/")
    for path in ("/health", "/studies", "/best-config?study=x"):
        r = TestClient(create_app(Settings(storage=down))).get(path)
        assert r.status_code == 503, r.text
        assert SECRET not in r.text and "cannot reach storage" in r.json()["detail"]
        assert "127.0.0.1" not in r.text and "postgres@" not in r.text  # no user, host or port (issue 24 §6)


def test_the_settings_repr_holds_no_password_and_no_token() -> None:
    settings = Settings(
        storage=f"postgresql+psycopg://bob:{SECRET}@db.example/tuner?sslpassword={SECRET}", api_token=TOKEN
    )
    for text in (repr(settings), str(settings)):
        assert SECRET not in text and TOKEN not in text, text
        assert "bob" in text and "db.example" in text
