"""POST /studies takes the training host's transformers release (issue 30, point 2): the baseline's "auto" is filled
as its Trainer fills them, and the study keeps the release and the fixes the exports write for it."""

from __future__ import annotations

import json
from pathlib import Path

from fastapi.testclient import TestClient

from api.app import create_app
from tuner.settings import Settings
from tuner.storage import Store

TOKEN = "s3cret-token-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SEED = Path(__file__).resolve().parents[1] / "data" / "seed"
DS = json.loads((SEED / "ds_config.json").read_text())
ARGS = {"per_device_train_batch_size": 2, "bf16": True, "learning_rate": 2e-5, "max_source_length": 512}


def test_a_study_is_defined_for_the_training_hosts_release(sqlite_url: str) -> None:
    client = TestClient(create_app(Settings(storage=sqlite_url, api_token=TOKEN)))
    body = {"name": "t517", "baseline": DS, "training_args": ARGS, "transformers_version": "5.17.0"}
    r = client.post("/studies", json=body, headers=AUTH)
    assert r.status_code == 201, r.text
    stored = Store(sqlite_url).require_study("t517")
    assert stored["trainer"]["transformers"] == "5.17.0"
    assert [(f["key"], f["runs"], f["new"]) for f in stored["trainer"]["fixes"]] == [
        ("scheduler.params.warmup_num_steps", 0, 1),
        ("warmup_steps", None, 1),
    ]
    assert stored["baseline_source"]["scheduler"]["params"]["warmup_num_steps"] == 1  # what the search probes
    bad = client.post("/studies", json={**body, "name": "bad", "transformers_version": "newest"}, headers=AUTH)
    assert bad.status_code == 400
    assert (
        bad.json()["detail"] == "transformers_version 'newest' is not a version; give your training host's, e.g. 4.46.3"
    )
    assert Store(sqlite_url).study_definition("bad") is None
