"""Reads over a populated storage (SQLite and PostgreSQL): studies, trials, best-config with provenance."""

from __future__ import annotations

import json
import statistics

import pytest

from tests.helpers.sample_storage import BEST_TRIAL, CAPACITY, GLOBAL_BATCH, WORLD, MiB
from tuner.records.throughput import throughput
from tuner.search.selection import best_stable
from tuner.storage import Store


def test_health_reports_ok_and_hides_nothing_secret(client) -> None:
    r = client.get("/health")
    assert r.status_code == 200
    assert r.json()["status"] == "ok"


def test_studies_lists_newest_first_with_status(client) -> None:
    r = client.get("/studies")
    assert r.status_code == 200
    studies = r.json()["studies"]
    assert [s["name"] for s in studies] == ["fresh", "t5-demo"]
    assert {s["name"]: s["status"] for s in studies} == {"fresh": "defined", "t5-demo": "finished"}


def test_study_detail_counts_states_causes_budget_progress_and_best(client) -> None:
    body = client.get("/studies/t5-demo").json()
    assert body["status"] == "finished"
    assert body["budget_s"] == 120.0
    assert body["trial_states"] == {"COMPLETE": 4, "PRUNED": 2, "FAIL": 1, "RUNNING": 1}
    assert body["probe_statuses"] == {"ok": 5, "oom": 1, "inferred-oom": 1, "error": 1}
    assert body["progress"]["trials"] == 8
    assert body["progress"]["probes"] == 8
    assert body["progress"]["fraction"] == 1.0
    assert body["best"]["trial_number"] == BEST_TRIAL
    assert body["best"]["confirmed"] is True
    assert body["definition"]["world_size"] == WORLD
    assert [r["status"] for r in body["runs"]] == ["finished"]


def test_defined_study_has_no_best_and_zero_progress(client) -> None:
    body = client.get("/studies/fresh").json()
    assert body["status"] == "defined"
    assert body["best"] is None
    assert body["trial_states"] == {}
    assert body["progress"]["fraction"] == 0.0


def test_trials_are_paginated_in_trial_order(client) -> None:
    first = client.get("/studies/t5-demo/trials", params={"limit": 3}).json()
    assert first["total"] == 8
    assert [t["number"] for t in first["trials"]] == [0, 1, 2]
    rest = client.get("/studies/t5-demo/trials", params={"offset": 6, "limit": 50}).json()
    assert [t["number"] for t in rest["trials"]] == [6, 7]
    assert client.get("/studies/t5-demo/trials", params={"offset": 100}).json()["trials"] == []


def test_trials_carry_params_status_cause_throughput_and_rank_memory(client) -> None:
    trials = {t["number"]: t for t in client.get("/studies/t5-demo/trials").json()["trials"]}
    oom = trials[1]
    assert oom["state"] == "PRUNED"
    assert "OutOfMemoryError" in oom["cause"]
    assert [r["rank"] for r in oom["ranks"]] == [0, 1]
    assert oom["ranks"][0]["peak_allocated"] == 170 * MiB
    assert trials[4]["cause"].startswith("inferred-oom")
    assert trials[5]["state"] == "FAIL" and "gloo" in trials[5]["cause"]
    best = trials[BEST_TRIAL]
    assert best["params"] == {"micro_batch_size": 4, "zero_stage": 2}
    assert [p["fidelity"] for p in best["probes"]] == ["short", "confirm"]
    assert best["samples_per_s"] == 19.0  # the latest probe: the confirmation
    assert trials[7]["state"] == "RUNNING" and trials[7]["probes"] == []


@pytest.mark.parametrize("params", [{"limit": 0}, {"limit": 501}, {"offset": -1}, {"limit": "many"}])
def test_trials_page_bounds_are_422(client, params) -> None:
    r = client.get("/studies/t5-demo/trials", params=params)
    assert r.status_code == 422
    assert isinstance(r.json()["detail"], str)


def test_best_config_json_has_provenance(client, populated_url) -> None:
    r = client.get("/best-config", params={"study": "t5-demo"})
    assert r.status_code == 200
    body = r.json()
    expected = best_stable(Store(populated_url).probes("t5-demo"))
    assert body["trial_number"] == BEST_TRIAL == expected.trial_number
    assert body["knobs"]["micro_batch_size"] == 4 and body["knobs"]["zero_stage"] == 2
    assert body["world_size"] == WORLD
    assert body["gradient_accumulation_steps"] == 2
    assert body["global_batch"] == GLOBAL_BATCH
    assert body["confirmed"] is True and body["measurements"] == 2
    assert body["samples_per_s"] == statistics.median([20.0, 19.0])
    assert body["objective"] == pytest.approx(throughput(expected.rows).value)  # the median, as every face shows
    assert body["peak_allocated"] == 121 * MiB
    assert body["capacity"] == CAPACITY
    assert body["headroom"] == 0.9
    assert body["memory_fraction"] == pytest.approx(121 / 160)
    assert body["versions"]["deepspeed"] == "0.19.8"
    assert body["fingerprint"]["device"] == "cpu"
    assert body["content"] is None


def test_best_config_reports_speedup_over_baseline(client) -> None:
    body = client.get("/best-config", params={"study": "t5-demo"}).json()
    base = body["baseline"]
    assert base["status"] == "ok" and base["samples_per_s"] == 10.0
    assert base["speedup"] == pytest.approx(body["objective"] / base["objective"])
    assert base["speedup"] > 1.5
    # the same verdict and changes `tuner best --changes` prints (this study has no baseline files: the knobs)
    changes = body["changes"]
    assert changes["verdict"].startswith(f"{base['speedup']:.2f}x the throughput of your config")
    assert {"file": "knobs", "key": "zero_stage", "old": None, "new": 2, "added": True, "removed": False} in changes[
        "changes"
    ]
    assert changes["lines"][-1] == changes["verdict"]


def test_best_config_raw_json_is_the_config_file(client) -> None:
    r = client.get("/best-config", params={"study": "t5-demo", "raw": "true"})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/json")
    body = json.loads(r.text)
    assert body["knobs"]["micro_batch_size"] == 4 and body["gradient_accumulation_steps"] == 2


def test_best_config_needs_the_study_never_the_most_recent(client) -> None:
    r = client.get("/best-config")
    assert r.status_code == 422  # "fresh" is the newest; serving it would let any POST /studies take over
    assert "study=" in r.json()["detail"]


def test_unknown_study_is_404_with_a_clear_message(client) -> None:
    for path in ("/studies/nope", "/studies/nope/trials", "/best-config?study=nope"):
        r = client.get(path)
        assert r.status_code == 404, path
        assert "no study named 'nope'" in r.json()["detail"]


@pytest.mark.parametrize("name", ["a" * 129, "bad name", "semi;colon", "ü", "a/b%2F..", "$(id)"])
def test_invalid_study_names_are_4xx(client, name) -> None:
    for path, params in ((f"/studies/{name}", None), ("/best-config", {"study": name})):
        r = client.get(path, params=params)
        assert 400 <= r.status_code < 500, (path, name, r.status_code)
        assert isinstance(r.json()["detail"], str)


def test_longest_valid_name_is_accepted(client) -> None:
    r = client.get(f"/studies/{'a' * 128}")
    assert r.status_code == 404


def test_unknown_format_is_422(client) -> None:
    r = client.get("/best-config", params={"study": "t5-demo", "format": "yaml"})
    assert r.status_code == 422
    assert "format" in r.json()["detail"]


@pytest.mark.parametrize("fmt", ["deepspeed", "hf", "accelerate", "env"])
def test_every_export_format_is_served(client, fmt) -> None:
    body = client.get("/best-config", params={"study": "t5-demo", "format": fmt}).json()
    assert body["format"] == fmt and body["trial_number"] == BEST_TRIAL
    assert body["content"].strip()
    raw = client.get("/best-config", params={"study": "t5-demo", "format": fmt, "raw": "true"})
    assert raw.status_code == 200 and raw.text == body["content"]


def test_deepspeed_export_has_consistent_batch_fields(client) -> None:
    ds = json.loads(client.get("/best-config", params={"study": "t5-demo", "format": "deepspeed", "raw": "1"}).text)
    assert ds["train_micro_batch_size_per_gpu"] == 4
    assert ds["gradient_accumulation_steps"] == 2
    assert ds["train_batch_size"] == 4 * 2 * WORLD == GLOBAL_BATCH
    assert ds["zero_optimization"]["stage"] == 2


def test_api_and_cli_hand_out_the_same_config(client, populated_url) -> None:
    """`tuner best --format deepspeed` and GET /best-config?format=deepspeed agree byte for byte."""
    import subprocess

    from tests.helpers.servers import TUNER_BIN, clean_env

    out = subprocess.run(
        [TUNER_BIN, "best", "--storage", populated_url, "--study", "t5-demo", "--format", "deepspeed"],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    api = client.get("/best-config", params={"study": "t5-demo", "format": "deepspeed", "raw": "1"}).text
    assert json.loads(out.stdout) == json.loads(api)
