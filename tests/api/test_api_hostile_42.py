"""Issue 42, the API side: the API bounds what it stores per field and what it echoes. A 200 KB key was echoed whole
in a 400 (the 422 cut did not apply to a TunerError), and 100,000 wrap-class names in one 200 KB string were stored
and answered in a 602 KB 201; NaN and -Infinity deep in the training args are refused as in a file."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from tuner.settings import Settings
from tuner.storage import Store

TOKEN = "s3cret-token-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
HF = {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 1, "learning_rate": 1e-4, "max_seq_length": 64}


@pytest.fixture
def quick(sqlite_url: str) -> tuple[TestClient, str]:
    app = create_app(Settings(storage=sqlite_url, api_token=TOKEN))
    return TestClient(app, raise_server_exceptions=False), sqlite_url


def _post(client: TestClient, body: dict | str) -> tuple[int, str, int]:
    if isinstance(body, str):
        r = client.post("/studies", content=body, headers={**AUTH, "Content-Type": "application/json"})
    else:
        r = client.post("/studies", json=body, headers=AUTH)
    detail = r.json().get("detail", "")
    assert isinstance(detail, str) and "\n" not in detail, r.text[:500]
    return r.status_code, detail, len(r.content)


def test_a_200_kb_key_is_refused_without_being_echoed(quick: tuple[TestClient, str]) -> None:
    client, url = quick
    body = {"name": "key", "model": "builtin:tiny-t5", "training_args": {**HF, "k" * 200_000: 1}}
    status, detail, size = _post(client, body)
    assert status == 422 and "has a key of 200,000 characters" in detail, detail[:300]
    assert size < 20_000 and Store(url).study_definition("key") is None


def test_100000_wrap_class_names_are_not_stored(quick: tuple[TestClient, str]) -> None:
    client, url = quick
    names = ",".join(f"L{k}" for k in range(100_000))[:200_000]
    args = {**HF, "fsdp": "full_shard", "fsdp_config": {"transformer_layer_cls_to_wrap": names}}
    status, detail, size = _post(client, {"name": "wrap", "model": "builtin:tiny-llama", "training_args": args})
    assert status == 422 and "transformer_layer_cls_to_wrap is 200,000 characters" in detail, detail[:300]
    assert size < 20_000 and Store(url).study_definition("wrap") is None


@pytest.mark.parametrize("bad", ["NaN", "-Infinity"])
def test_a_non_finite_training_arg_is_422(bad: str, quick: tuple[TestClient, str]) -> None:
    client, url = quick
    raw = json.dumps({"name": "nan", "model": "builtin:tiny-t5", "training_args": {**HF, "max_grad_norm": 7.5}})
    status, detail, _ = _post(client, raw.replace("7.5", bad))
    assert status == 422 and "training_args.max_grad_norm is" in detail and "not a finite number" in detail, detail
    assert Store(url).study_definition("nan") is None


@pytest.mark.parametrize("fsdp", [[{"a": 1}], [["full_shard"]]])
def test_an_unhashable_fsdp_option_is_a_4xx_not_a_500(fsdp: list[object], quick: tuple[TestClient, str]) -> None:
    """Before: 500 "internal error (TypeError)" (the option was looked up in a dict)."""
    client, url = quick
    body = {"name": "fsdp", "model": "builtin:tiny-t5", "training_args": {**HF, "fsdp": fsdp}}
    status, detail, _ = _post(client, body)
    assert 400 <= status < 500 and "each item is one of transformers' option strings" in detail, (status, detail)
    assert Store(url).study_definition("fsdp") is None
