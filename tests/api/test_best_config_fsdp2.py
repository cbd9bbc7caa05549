"""A study whose baseline and pick run FSDP2, as every face hands it out: GET /best-config names the engine and lists
what the export changes in the user's accelerate config, refuses a DeepSpeed JSON in one line; `tuner best --changes`
prints the same lines; the report shows the engine and opens on the accelerate config. Real SQLite storage, the
study definition written by the search's own request builder."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient

from api.app import create_app
from tests.helpers.sample_storage import CAPACITY, SampleStudy, _result, config_key
from trials.contract import Knobs, ModelSpec, ProbeConfig
from tuner.interop.baseline import parse_baseline
from tuner.job.space import default_space
from tuner.search.request import build_request
from tuner.settings import Settings

ARGS = {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "output_dir": "out", "max_seq_length": 64}
ACCELERATE = {
    "distributed_type": "FSDP",
    "mixed_precision": "no",
    "num_processes": 2,
    "fsdp_config": {"fsdp_version": 2, "fsdp_reshard_after_forward": False, "fsdp_offload_params": True},
}


@pytest.fixture(scope="module")
def fsdp_study(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('fsdp2') / 'tuner.db'}"
    request = build_request(
        study_name="fsdp2",
        storage=url,
        model=ModelSpec(source="builtin:tiny-llama"),
        space=default_space().restrict(engine=["fsdp2"], zero_stage=[0], reshard_after_forward=[True, False]),
        budget_s=60,
        baseline=lambda world, length: parse_baseline(None, ARGS, accelerate=ACCELERATE, max_length=length),
        device_memory=CAPACITY,
    )
    sample = SampleStudy(url, "fsdp2", request.definition())
    assert request.baseline is not None
    picked = Knobs.model_validate({**request.baseline.model_dump(), "reshard_after_forward": True})
    for trial, knobs, fidelity, samples in ((0, request.baseline, "baseline", 10.0), (1, picked, "short", 20.0)):
        for fid in (fidelity, "confirm") if fidelity == "short" else (fidelity,):
            cfg = ProbeConfig(knobs=knobs, world_size=2, gradient_accumulation_steps=2, device_memory=CAPACITY)
            result = _result("ok", samples, 60, None, 64)
            sample.probe(cfg, result, trial_number=trial, config_key=config_key(knobs.model_dump(), 2), fidelity=fid)
    return url


def test_best_config_names_the_engine_and_the_changes_to_their_accelerate_config(fsdp_study: str) -> None:
    client = TestClient(create_app(Settings(storage=fsdp_study)))
    body = client.get("/best-config", params={"study": "fsdp2"}).json()
    assert body["engine"] == "fsdp2" and body["knobs"]["reshard_after_forward"] is True
    lines = body["changes"]["lines"]
    assert body["changes"]["engine"].startswith("engine: FSDP2") and lines[0] == body["changes"]["engine"]
    assert "accelerate config: fsdp_config.fsdp_reshard_after_forward: False -> True" in lines
    # their FSDP2 setup lives in their accelerate config: their training args only turn the Trainer's checkpointing off
    assert not any(line.startswith("training args: fsdp") for line in lines)
    assert "training args: activation_checkpointing: (unset) -> False" in lines
    accelerate = client.get("/best-config", params={"study": "fsdp2", "format": "accelerate"}).json()
    config = yaml.safe_load(accelerate["content"])
    assert config["distributed_type"] == "FSDP" and config["fsdp_config"]["fsdp_offload_params"] is True
    refused = client.get("/best-config", params={"study": "fsdp2", "format": "deepspeed"})
    assert 400 <= refused.status_code < 500 and "engine fsdp2" in refused.json()["detail"]
    assert "\n" not in refused.json()["detail"]


def test_tuner_best_changes_prints_the_same_lines(
    fsdp_study: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from tuner.cli import main as tuner_main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["tuner", "best", "--storage", fsdp_study, "--study", "fsdp2", "--changes"])
    try:
        tuner_main()
    except SystemExit as done:  # a clean exit may raise SystemExit(0) or return
        assert done.code in (0, None)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("engine: FSDP2") and any("fsdp_reshard_after_forward: False -> True" in x for x in out)


def test_the_report_shows_the_engine_and_opens_on_the_accelerate_config(fsdp_study: str) -> None:
    from tuner.reporting.html import load, render_html

    data = load(fsdp_study, "fsdp2")
    assert next(iter(data.exports)) == "accelerate" and "distributed_type: FSDP" in data.exports["accelerate"]
    assert data.exports["deepspeed"].startswith("(cannot render deepspeed: the pick runs engine fsdp2")
    page: Any = render_html(data)
    assert "<td>engine</td><td>FSDP2 (PyTorch fully_shard through accelerate, fsdp_version 2)</td>" in page
