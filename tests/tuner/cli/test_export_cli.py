"""`tuner export --study S --format F [-o FILE]` through the real entry point over a real SQLite storage."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers.sample_storage import SampleStudy

TUNER = [sys.executable, "-c", "from tuner.cli import main; main()"]
FAST = {
    "micro_batch_size": 4,
    "max_length": 128,
    "zero_stage": 2,
    "overlap_comm": True,
    "reduce_bucket_size": 50_000_000,
    "precision": "bf16",
    "alloc_conf": "expandable_segments:True",
}
SLOW = {"micro_batch_size": 1, "max_length": 128, "zero_stage": 3}
BASELINE_DS = {"optimizer": {"type": "AdamW", "params": {"lr": 3e-4}}, "gradient_clipping": 0.3}


def probe_row(sample: SampleStudy, key: str, knobs: dict, objective: float, stable: bool, trial: int) -> None:
    sample.record(
        trial_number=trial,
        fidelity="short",
        config_key=key,
        knobs=knobs,
        config={"knobs": knobs, "world_size": 4, "gradient_accumulation_steps": 2},
        status="ok",
        samples_per_s=objective,
        objective=objective,
        peak_allocated=10,
        capacity=100,
        alloc_retries=0,
        stable=stable,
    )


@pytest.fixture
def storage(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    sample = SampleStudy(url, "s", {"world_size": 4, "baseline_source": BASELINE_DS})
    probe_row(sample, "fast", FAST, 50.0, True, 1)
    probe_row(sample, "slow", SLOW, 10.0, True, 2)
    probe_row(sample, "oom", {**FAST, "micro_batch_size": 64}, 99.0, False, 3)
    store = sample.store
    store.ensure_study("empty", {"world_size": 1})
    return url


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TUNER, *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def test_export_deepspeed_is_the_best_stable_config(storage: str, tmp_path: Path) -> None:
    proc = run("export", "--study", "s", "--format", "deepspeed", "--storage", storage, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    ds = json.loads(proc.stdout)
    assert ds["train_micro_batch_size_per_gpu"] == 4 and ds["train_batch_size"] == 4 * 2 * 4
    assert ds["zero_optimization"]["reduce_bucket_size"] == 50_000_000 and ds["bf16"]["enabled"] is True
    assert ds["optimizer"] == BASELINE_DS["optimizer"] and ds["gradient_clipping"] == 0.3  # kept from the baseline


@pytest.mark.parametrize("fmt", ["json", "hf", "env"])
def test_export_other_formats_to_a_file(storage: str, tmp_path: Path, fmt: str) -> None:
    out = tmp_path / f"best.{fmt}"
    proc = run("export", "--study", "s", "-f", fmt, "-o", str(out), "--storage", storage, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "" and "trial 1" in proc.stderr
    text = out.read_text()
    if fmt == "env":
        assert "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in text
    elif fmt == "hf":
        assert json.loads(text)["per_device_train_batch_size"] == 4 and json.loads(text)["learning_rate"] == 3e-4
    else:
        assert json.loads(text)["global_batch"] == 32


def test_export_accelerate_writes_the_deepspeed_json_it_points_at(storage: str, tmp_path: Path) -> None:
    out = tmp_path / "acc.yaml"
    proc = run("export", "--study", "s", "--format", "accelerate", "-o", str(out), "--storage", storage, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    config = yaml.safe_load(out.read_text())
    ds_file = Path(config["deepspeed_config"]["deepspeed_config_file"])
    assert ds_file.is_absolute() and ds_file == (tmp_path / "acc.deepspeed.json").resolve()
    assert json.loads(ds_file.read_text())["train_batch_size"] == 32 and config["num_processes"] == 4


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--study", "nope"], "no study named 'nope'"),
        (["--study", "empty"], "has no stable config yet"),
        (["--study", "s", "--format", "yaml"], "unknown --format 'yaml'"),
        (["--study", "s", "-o", "/nonexistent-dir/x.json"], "cannot write"),
        ([], "--study"),
    ],
)
def test_export_mistakes_are_one_line_exit_2(storage: str, tmp_path: Path, args: list[str], match: str) -> None:
    proc = run("export", *args, "--storage", storage, cwd=tmp_path)
    assert proc.returncode == 2
    assert match in proc.stderr and "Traceback" not in proc.stderr


def test_every_face_serves_the_same_best_config_and_the_same_refusal(storage: str, tmp_path: Path) -> None:
    """`tuner best`, `tuner export`, tuner.best_config and GET /best-config are one function (tuner.session.best):
    the same export, and for a study without a stable config the same line."""
    from fastapi.testclient import TestClient

    import tuner
    from api.app import create_app
    from tuner.errors import NoStableConfig
    from tuner.settings import Settings

    client = TestClient(create_app(Settings(storage=storage)))
    best = run("best", "--study", "s", "--format", "deepspeed", "--storage", storage, cwd=tmp_path)
    export = run("export", "--study", "s", "--format", "deepspeed", "--storage", storage, cwd=tmp_path)
    python = tuner.best_config("s", storage=storage, format="deepspeed")
    http = client.get("/best-config", params={"study": "s", "format": "deepspeed"})
    assert best.returncode == export.returncode == 0 and http.status_code == 200, best.stderr + export.stderr
    assert best.stdout == export.stdout == python.content == http.json()["content"]
    changes = run("best", "--study", "s", "--changes", "--storage", storage, cwd=tmp_path)
    assert changes.stdout.splitlines() == python.changes == http.json()["changes"]["lines"]

    with pytest.raises(NoStableConfig) as refused:
        tuner.best_config("empty", storage=storage)
    line = str(refused.value)
    assert line.startswith("study 'empty' has no stable config yet (0 probes so far)")
    for face in ("best", "export"):
        proc = run(face, "--study", "empty", "--storage", storage, cwd=tmp_path)
        assert proc.returncode == 2 and proc.stderr.strip().endswith(line), proc.stderr
    answer = client.get("/best-config", params={"study": "empty"})
    assert answer.status_code == 404 and answer.json()["detail"] == line


def test_the_hf_export_names_checkpointing_as_the_training_hosts_transformers(storage: str, tmp_path: Path) -> None:
    """transformers 5.0-5.22 has no activation_checkpointing field: Seq2SeqTrainingArguments(**export) raised
    TypeError there (issue 23, defect 11). --transformers-version picks the field; this host's by default."""
    old = run(
        "export", "--study", "s", "-f", "hf", "--transformers-version", "5.17.0", "--storage", storage, cwd=tmp_path
    )
    assert old.returncode == 0, old.stderr
    hf = json.loads(old.stdout)
    assert "gradient_checkpointing" in hf and "activation_checkpointing" not in hf
    new = run(
        "export", "--study", "s", "-f", "hf", "--transformers-version", "5.23.0", "--storage", storage, cwd=tmp_path
    )
    assert "activation_checkpointing" in json.loads(new.stdout)
    bad = run(
        "export", "--study", "s", "-f", "hf", "--transformers-version", "latest", "--storage", storage, cwd=tmp_path
    )
    assert bad.returncode == 2 and "--transformers-version 'latest' is not a version" in bad.stderr
    assert "Traceback" not in bad.stderr
