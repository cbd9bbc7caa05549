"""Tune, then train with the pick, and record the real run back into the study (CPU is fine: built-in tiny T5).

    python examples/tune_and_train.py --budget 3m --storage sqlite:///tuner.db

1. ``tuner.tune`` runs the search (the same as `tuner search`), here on a 160 MiB emulated device;
2. ``apply_best`` puts the best config into your own Seq2SeqTrainingArguments (only the tuned fields change);
3. ``TunerCallback`` records this training run as a production row: `tuner trials` shows it beside the probes.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch
from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments

import tuner
from trials.contract import ModelSpec, free_port
from trials.models import build_model
from tuner.integrations.transformers import TunerCallback, apply_best


class RandomPairs(torch.utils.data.Dataset):
    """Stand-in data: random token ids at the tuned length (use your tokenised dataset here)."""

    def __init__(self, n: int, length: int) -> None:
        self.n, self.length = n, length

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        ids = torch.randint(3, 512, (self.length,), generator=g)
        return {
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
            "labels": torch.randint(3, 512, (16,), generator=g),
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", default="3m")
    ap.add_argument("--storage", default="sqlite:///tuner.db")
    ap.add_argument("--study", default="example")
    opts = ap.parse_args()
    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}.items():
        os.environ.setdefault(name, value)  # one process: the Trainer's DeepSpeed integration needs a process group
    os.environ.setdefault("MASTER_PORT", str(free_port()))

    result = tuner.tune(
        budget=opts.budget,
        storage=opts.storage,
        study=opts.study,
        device_memory="160MiB",
        space={"micro_batch_size": [1, 2, 4, 8], "zero_stage": [0, 1], "gradient_checkpointing": [False, True]},
        max_length=64,
        max_target_length=16,
        finalists=0,
    )
    print(f"search stopped ({result.stop_reason}) after {len(result.probes)} probes")
    if result.best is None:
        raise SystemExit("no stable config: give a larger budget or device memory")
    print("\n".join(result.best.changes))

    mine = Seq2SeqTrainingArguments(
        output_dir=tempfile.mkdtemp(), use_cpu=True, max_steps=4, learning_rate=3e-4, report_to=[], save_strategy="no"
    )
    args = apply_best(mine, study=result.study, storage=opts.storage)
    trainer = Seq2SeqTrainer(
        model=build_model(ModelSpec()),  # the model the study tuned (builtin:tiny-t5)
        args=args,
        train_dataset=RandomPairs(64, 64),
        callbacks=[TunerCallback(result.study, storage=opts.storage)],
    )
    trainer.train()
    print(
        f"trained {trainer.state.global_step} steps at micro batch {args.per_device_train_batch_size}; "
        f"see `tuner trials --study {result.study} --storage {opts.storage}`"
    )


if __name__ == "__main__":
    main()
