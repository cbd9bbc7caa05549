"""The hf export trains: Seq2SeqTrainer with Seq2SeqTrainingArguments(**to_hf(...)) runs a few optimizer steps of a
tiny random-init T5 on CPU -- once plain (engine torch) and once through the Trainer's own DeepSpeed integration
(ZeRO-2, the DeepSpeed section of the export). Each run is its own process: the DeepSpeed run initialises a one-rank
process group (RANK/LOCAL_RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, no launcher needed). Optimizer offload is left out
here: DeepSpeedCPUAdam compiles on first use (minutes on a loaded 2-core box); test_export_tools covers its config."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.helpers.servers import one_rank_env

SCRIPT = r"""
import json, sys, tempfile
import torch
from transformers import T5Config, T5ForConditionalGeneration, Seq2SeqTrainer, Seq2SeqTrainingArguments
from tuner.interop.export import to_hf

knobs, accum = json.loads(sys.argv[1]), int(sys.argv[2])
kwargs = to_hf(knobs, world_size=1, gradient_accumulation_steps=accum)
cfg = T5Config(vocab_size=64, d_model=32, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=2, d_kv=16,
               decoder_start_token_id=0, pad_token_id=0)
torch.manual_seed(0)
model = T5ForConditionalGeneration(cfg)
L = knobs["max_length"]

class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return {"input_ids": torch.randint(1, 64, (L,), generator=g), "attention_mask": torch.ones(L, dtype=torch.long),
                "labels": torch.randint(1, 64, (L,), generator=g)}

args = Seq2SeqTrainingArguments(output_dir=tempfile.mkdtemp(), use_cpu=True, max_steps=3, report_to=[],
                                save_strategy="no", learning_rate=1e-3, logging_steps=1, **kwargs)
trainer = Seq2SeqTrainer(model=model, args=args, train_dataset=Data())
out = trainer.train()
info = {"steps": trainer.state.global_step, "loss": out.training_loss, "deepspeed": trainer.is_deepspeed_enabled,
        "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h]}
if trainer.is_deepspeed_enabled:
    engine = trainer.model_wrapped
    info.update(stage=engine.zero_optimization_stage(), micro=engine.train_micro_batch_size_per_gpu(),
                accum=engine.gradient_accumulation_steps(), bucket=engine.zero_reduce_bucket_size())
with open(sys.argv[3], "w") as f:
    json.dump(info, f)
"""


def trainer_env() -> dict[str, str]:
    """A one-rank process group for the Trainer's DeepSpeed integration, and the probes' op cache (one_rank_env)."""
    return one_rank_env(TOKENIZERS_PARALLELISM="false")


def run_trainer(tmp_path: Path, knobs: dict, accum: int) -> dict:
    env = trainer_env()
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(knobs), str(accum), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.slow
def test_seq2seq_trainer_trains_with_the_hf_export(tmp_path: Path) -> None:
    knobs = {
        "micro_batch_size": 2,
        "max_length": 16,
        "engine": "torch",
        "gradient_checkpointing": True,
        "eval_batch_size": 2,
        "generate": True,
    }
    info = run_trainer(tmp_path, knobs, accum=2)
    assert info["steps"] == 3 and not info["deepspeed"]
    assert len(info["losses"]) == 3 and all(0 < float(x) < 100 for x in info["losses"])


@pytest.mark.slow
def test_seq2seq_trainer_trains_with_the_hf_export_through_deepspeed(tmp_path: Path) -> None:
    knobs = {
        "micro_batch_size": 2,
        "max_length": 16,
        "zero_stage": 2,
        "overlap_comm": True,
        "reduce_bucket_size": 10_000_000,
    }
    info = run_trainer(tmp_path, knobs, accum=2)
    assert info["steps"] == 3 and info["deepspeed"]
    assert (info["stage"], info["micro"], info["accum"], info["bucket"]) == (2, 2, 2, 10_000_000)
    assert all(0 < float(x) < 100 for x in info["losses"])


SEED = Path(__file__).resolve().parents[2] / "data" / "seed"  # the motivating team's files, verbatim

SEED_SCRIPT = r"""
import json, sys, tempfile
import torch
from transformers import (HfArgumentParser, T5Config, T5ForConditionalGeneration, Seq2SeqTrainer,
                          Seq2SeqTrainingArguments)

export, L, T = json.loads(open(sys.argv[1]).read()), int(sys.argv[2]), int(sys.argv[3])
# this host's business, not the job's: where to write, no wandb, CPU; a short run and no checkpoints
host = {"output_dir": tempfile.mkdtemp(), "report_to": [], "use_cpu": True, "max_steps": 3, "eval_strategy": "no",
        "save_strategy": "no"}
if isinstance(export.get("deepspeed"), dict) and "optimizer" in export["deepspeed"]:
    # the CPU stand-in the probe uses too (trials.engine.probe_deepspeed_config): FusedAdam needs CUDA
    export["deepspeed"]["optimizer"].setdefault("params", {})["torch_adam"] = True
(args,) = HfArgumentParser(Seq2SeqTrainingArguments).parse_dict({**export, **host}, allow_extra_keys=True)
cfg = T5Config(vocab_size=64, d_model=64, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=2, d_kv=32,
               decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
torch.manual_seed(0)
model = T5ForConditionalGeneration(cfg)

class Data(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n = n
    def __len__(self):
        return self.n
    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return {"input_ids": torch.randint(3, 64, (L,), generator=g), "attention_mask": torch.ones(L, dtype=torch.long),
                "labels": torch.randint(3, 64, (T,), generator=g)}

trainer = Seq2SeqTrainer(model=model, args=args, train_dataset=Data(64), eval_dataset=Data(60))
out = trainer.train()
metrics = trainer.evaluate()
pred = trainer.predict(Data(60))
info = {"steps": trainer.state.global_step, "loss": out.training_loss, "deepspeed": trainer.is_deepspeed_enabled,
        "eval_loss": metrics.get("eval_loss"), "generated": list(pred.predictions.shape), "bf16": args.bf16,
        "eval_batch": args.per_device_eval_batch_size, "generate": args.predict_with_generate,
        "checkpointing": bool(getattr(args, "activation_checkpointing", False) or args.gradient_checkpointing)}
if trainer.is_deepspeed_enabled:
    engine = trainer.model_wrapped
    info.update(stage=engine.zero_optimization_stage(), micro=engine.train_micro_batch_size_per_gpu(),
                accum=engine.gradient_accumulation_steps(), bucket=engine.zero_reduce_bucket_size())
with open(sys.argv[4], "w") as f:
    json.dump(info, f)
"""


def seed_export(engine: str) -> dict:
    """The hf export of a tuned config of the motivating team's files (their bf16, eval batch 50 and
    predict_with_generate; a ZeRO-1 config with 1e7 buckets, or plain PyTorch) as `tuner best --format hf` writes."""
    from trials.contract import Knobs
    from tuner.interop.baseline_files import load_baseline
    from tuner.interop.export import UserFiles, hf_export, installed_transformers

    # their files as this host's transformers 5 Trainer takes them: overwrite_output_dir (4.x) dropped
    theirs = json.loads((SEED / "training_args.json").read_text())
    theirs.pop("overwrite_output_dir")
    theirs["deepspeed"] = str(SEED / "ds_config.json")
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "training_args.json").write_text(json.dumps(theirs))
        base = load_baseline(Path(tmp) / "training_args.json", world_size=1, hidden_size=64, max_length=16)
    tuned = {"micro_batch_size": 4, "gradient_checkpointing": True, "offload_optimizer": False, "overlap_comm": False}
    tuned |= {"zero_stage": 1, "reduce_bucket_size": 10_000_000} if engine == "deepspeed" else {"zero_stage": 0}
    knobs = Knobs.model_validate({**base.knobs, **tuned, "engine": engine})
    return hf_export(
        knobs.model_dump(),
        world_size=1,
        gradient_accumulation_steps=2,
        baseline=base.ds_config,
        files=UserFiles.of(base.files()),
        transformers_version=installed_transformers(),
    )


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["torch", "deepspeed"])
def test_seq2seq_trainer_trains_evaluates_and_generates_from_the_teams_export(tmp_path: Path, engine: str) -> None:
    export = seed_export(engine)
    assert ("deepspeed" in export) is (engine == "deepspeed")
    (tmp_path / "args.json").write_text(json.dumps(export))
    env = trainer_env()
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [sys.executable, "-c", SEED_SCRIPT, str(tmp_path / "args.json"), "16", "8", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads(out.read_text())
    assert info["steps"] == 3 and info["deepspeed"] is (engine == "deepspeed") and 0 < info["loss"] < 100
    assert info["bf16"] and info["generate"] and info["eval_batch"] == 50 and info["checkpointing"]
    assert info["eval_loss"] is not None and 0 < info["eval_loss"] < 100
    assert info["generated"][0] == 60 and info["generated"][1] > 1  # predict_with_generate generated tokens
    if engine == "deepspeed":
        assert (info["stage"], info["micro"], info["accum"], info["bucket"]) == (1, 4, 2, 10_000_000)
