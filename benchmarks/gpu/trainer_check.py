"""The chosen config through the user's path: Seq2SeqTrainer with the study's hf export (its DeepSpeed section inline)
for STEPS worst-case steps (every batch padded to the job's lengths), then one evaluate + predict_with_generate.

    python3 benchmarks/gpu/trainer_check.py STORAGE STUDY STEPS OUT_JSON

On a GPU the process is held to the study's device memory (set_per_process_memory_fraction), so a config that does
not fit OOMs here as it would on that device. Writes the peak reserved, the device-level use peak and the OOM count.
"""

from __future__ import annotations

import json
import sys
import tempfile

import torch
from transformers import HfArgumentParser, Seq2SeqTrainer, Seq2SeqTrainingArguments, TrainerCallback

from trials.contract import JobSettings, ModelSpec
from trials.models import build_model
from tuner.interop.export import render_best
from tuner.search.selection import best_stable
from tuner.storage import Store


class DeviceUse(TrainerCallback):
    """The device-level use (cudaMemGetInfo) after every step: the peak the stability rule bounds."""

    def __init__(self) -> None:
        self.peak = 0

    def on_step_end(self, args: object, state: object, control: object, **kwargs: object) -> None:
        if torch.cuda.is_available():
            free, total = torch.cuda.mem_get_info()
            self.peak = max(self.peak, total - free)


def on_cpu(ds: object) -> None:
    """The emulated device (the dry run): the DeepSpeed section as the probe ran it on CPU too."""
    if not isinstance(ds, dict):
        return
    if "optimizer" in ds:
        ds["optimizer"].setdefault("params", {})["torch_adam"] = True  # FusedAdam needs CUDA
    offload = ds.get("zero_optimization", {}).get("offload_optimizer")
    if isinstance(offload, dict) and offload.get("pin_memory"):
        offload["pin_memory"] = False  # pinning needs CUDA


def main() -> int:
    storage, study, steps, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    store = Store(storage)
    best = best_stable(store.probes(study))
    if best is None:
        with open(out, "w") as fh:
            json.dump({"error": "no stable config"}, fh)
        return 1
    definition = store.study_definition(study) or {}
    export = json.loads(render_best("hf", best, definition))
    cfg = best.config
    knobs, job = cfg["knobs"], cfg.get("job") or {}
    length, labels = int(knobs["max_length"]), int(job.get("max_target_length") or knobs["max_length"])
    cuda = torch.cuda.is_available()
    budget = cfg.get("device_memory")
    if cuda and budget:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, budget / total))
    host = {
        "output_dir": tempfile.mkdtemp(),
        "disable_tqdm": True,
        "report_to": [],
        "max_steps": steps,
        "eval_strategy": "no",
        "save_strategy": "no",
        "logging_steps": max(1, steps // 4),
        "use_cpu": not cuda,
    }
    if not cuda:
        on_cpu(export.get("deepspeed"))
    (args,) = HfArgumentParser(Seq2SeqTrainingArguments).parse_dict(  # type: ignore[arg-type]
        {**export, **host}, allow_extra_keys=True
    )
    model = build_model(ModelSpec.model_validate(cfg["model"]))
    vocab = int(model.config.vocab_size)

    class Data(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
        def __init__(self, n: int) -> None:
            self.n = n

        def __len__(self) -> int:
            return self.n

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            g = torch.Generator().manual_seed(i)
            return {
                "input_ids": torch.randint(3, vocab, (length,), generator=g),
                "attention_mask": torch.ones(length, dtype=torch.long),
                "labels": torch.randint(3, vocab, (labels,), generator=g),
            }

    use = DeviceUse()
    batch = args.per_device_train_batch_size * args.gradient_accumulation_steps
    trainer = Seq2SeqTrainer(model=model, args=args, train_dataset=Data(batch * steps), callbacks=[use])
    probed = JobSettings.model_validate(job)
    info: dict[str, object] = {
        "knobs": knobs,
        "deepspeed": bool(export.get("deepspeed")),
        "budget": budget,
        "cuda": cuda,
        "generation_max_length": args.generation_max_length if args.predict_with_generate else None,
        "probed_generation_length": probed.generation_length(length) if knobs.get("generate") else None,
    }
    ooms = 0
    try:
        trainer.train()
        eval_batch = args.per_device_eval_batch_size
        trainer.evaluate(Data(eval_batch))
        if args.predict_with_generate:
            trainer.predict(Data(eval_batch))
    except torch.OutOfMemoryError as exc:
        ooms += 1
        info["cause"] = str(exc).splitlines()[0][:300]
    info.update(
        steps=trainer.state.global_step,
        ooms=ooms,
        device_used_peak=use.peak,
        peak_reserved=torch.cuda.max_memory_reserved() if cuda else None,
    )
    with open(out, "w") as fh:
        json.dump(info, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
