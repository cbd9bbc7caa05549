"""The loop closed through a real Seq2SeqTrainer on CPU: tuner.tune searches the tiny T5, apply_best puts the pick
into the user's Seq2SeqTrainingArguments (their other fields untouched), TunerCallback records the real run as a
production row that `tuner trials` and GET /best-config show; a run that really runs out of memory (a host memory
limit under a long batch: torch's own allocator error) is recorded as oom and that config is never served again."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tuner
from tests.helpers.servers import one_rank_env
from tuner.errors import ConfigError, NoStableConfig
from tuner.integrations.transformers import tuned_changes
from tuner.records import Fidelity
from tuner.storage import Store

SPACE = {"micro_batch_size": [2, 32], "zero_stage": [0], "gradient_checkpointing": [False]}

SCRIPT = r"""
import json, resource, sys, tempfile
import torch
from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments
from trials.contract import ModelSpec
from trials.models import build_model
from tuner.integrations.transformers import TunerCallback, apply_best

study, storage, length, limit = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
mine = Seq2SeqTrainingArguments(output_dir=tempfile.mkdtemp(), use_cpu=True, max_steps=4, report_to=[],
                                save_strategy="no", learning_rate=3e-4, per_device_train_batch_size=64,
                                logging_steps=1, seed=7)
args = apply_best(mine, study=study, storage=storage)
model = build_model(ModelSpec())

class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return {"input_ids": torch.randint(3, 512, (length,), generator=g),
                "attention_mask": torch.ones(length, dtype=torch.long),
                "labels": torch.randint(3, 512, (length,), generator=g)}

callback = TunerCallback(study, storage=storage)
trainer = Seq2SeqTrainer(model=model, args=args, train_dataset=Data(), callbacks=[callback])
if limit:
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    used = int(open("/proc/self/status").read().split("VmData:")[1].split()[0]) * 1024
    resource.setrlimit(resource.RLIMIT_DATA, (used + limit, hard))
print("RAN " + json.dumps({"micro": args.per_device_train_batch_size, "accum": args.gradient_accumulation_steps,
                  "lr": args.learning_rate, "seed": args.seed, "deepspeed": bool(args.deepspeed)}), flush=True)
trainer.train()
"""


def run_training(study: str, url: str, length: int, limit: int = 0) -> subprocess.CompletedProcess[str]:
    env = one_rank_env(PYTHONPATH=str(Path(__file__).resolve().parents[3]))
    cmd = [sys.executable, "-c", SCRIPT, study, url, str(length), str(limit)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)


def test_tuned_changes_set_only_tuned_fields_and_refuse_a_different_job() -> None:
    export = {
        "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 2,
        "activation_checkpointing": True,
        "learning_rate": 1e-3,
        "bf16": True,
        "output_dir": "theirs",
    }
    fields = {
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "activation_checkpointing",
        "gradient_checkpointing",
        "learning_rate",
        "bf16",
        "output_dir",
        "deepspeed",
    }
    changes = tuned_changes(export, {"bf16": True}, fields)
    assert changes == {
        "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 2,
        "activation_checkpointing": True,
        "gradient_checkpointing": False,
        "deepspeed": None,
    }
    with pytest.raises(ConfigError, match="bf16=False but the study was tuned for bf16=True"):
        tuned_changes(export, {"bf16": False}, fields)


@pytest.mark.slow
def test_apply_best_and_the_callback_close_the_loop(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/tuner.db"
    result = tuner.tune(
        budget="3m", space=SPACE, device_memory="160MiB", storage=url, study="loop", finalists=0, seed=0, max_length=32
    )
    assert result.best is not None and result.study == "loop" and result.stop_reason
    micro = result.best.knobs["micro_batch_size"]
    statuses = {r.knobs["micro_batch_size"]: str(r.status) for r in result.probes}
    assert statuses[2] == "ok" and all(s in ("ok", "oom", "inferred-oom") for s in statuses.values())
    again = tuner.best_config("loop", storage=url, format="hf")  # what `tuner best` hands back: the same pick
    assert again.config_key == result.best.config_key and again.as_dict()["per_device_train_batch_size"] == micro
    assert json.loads(tuner.best_config(storage=url).content)["knobs"]["micro_batch_size"] == micro  # newest study
    done = run_training("loop", url, length=32)
    assert done.returncode == 0, done.stderr[-3000:]
    ran = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RAN "))[4:])
    # the pick's micro batch and accumulation; their learning rate and seed untouched
    assert (ran["micro"], ran["lr"], ran["seed"], ran["deepspeed"]) == (micro, 3e-4, 7, True)
    assert ran["accum"] == result.best.gradient_accumulation_steps
    rows = [r for r in Store(url).probes("loop") if r.fidelity == Fidelity.PRODUCTION]
    assert len(rows) == 1 and str(rows[0].status) == "ok" and rows[0].config_key == result.best.config_key
    assert rows[0].samples_per_s and rows[0].samples_per_s > 0 and rows[0].peak_allocated and rows[0].result
    assert rows[0].result["steps"] == 4
    trials = subprocess.run(
        [Path(sys.executable).with_name("tuner"), "trials", "--storage", url, "--study", "loop"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert trials.returncode == 0 and "production run" in trials.stdout, trials.stdout + trials.stderr
    from fastapi.testclient import TestClient

    from api.app import create_app
    from tuner.settings import Settings

    body = TestClient(create_app(Settings(storage=url))).get("/best-config", params={"study": "loop"}).json()
    assert [p["status"] for p in body["production"]] == ["ok"] and body["production"][0]["peak_allocated"] > 0

    # the same config in a run whose host memory cannot hold a long batch: torch's allocator fails, recorded as oom
    failed = run_training("loop", url, length=2048, limit=64 << 20)
    assert failed.returncode != 0 and "allocate memory" in failed.stderr, failed.stderr[-2000:]
    rows = [r for r in Store(url).probes("loop") if r.fidelity == Fidelity.PRODUCTION]
    assert [str(r.status) for r in rows] == ["ok", "oom"] and rows[1].config_key == result.best.config_key
    after = tuner.best_config("loop", storage=url)  # the other stable config; the failed one is never served again
    assert after.config_key != result.best.config_key
    assert "no longer served: 1 config whose real training run failed (see `tuner trials`)" in after.changes
    # had the other config failed too (its row given here), nothing would be left to serve, and the study says why
    Store(url).record_probe(dataclasses.replace(rows[1], config_key=after.config_key, id=None))
    with pytest.raises(NoStableConfig, match="whose real training run failed are no longer served"):
        tuner.best_config("loop", storage=url)
