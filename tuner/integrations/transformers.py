"""The HF Trainer closes the loop: ``apply_best`` puts a study's tuned config into your TrainingArguments, and
``TunerCallback`` records the real run back into the study as a ``production`` row (peak memory per rank, step time,
an out-of-memory failure), shown beside what the probes predicted. A config whose real run failed is never served
again (tuner.search.selection.failed_in_production).

    from tuner.integrations.transformers import TunerCallback, apply_best
    args = apply_best(Seq2SeqTrainingArguments(...), study="flan-large", storage="postgresql+psycopg://...")
    trainer = Seq2SeqTrainer(model=model, args=args, ..., callbacks=[TunerCallback("flan-large", storage=...)])

Only the tuned knobs change (micro batch, accumulation, checkpointing, eval batch, the DeepSpeed config); your job's
settings (precision, predict_with_generate) must match the study's, or ``apply_best`` says which one differs.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import sys
import time
from collections.abc import Mapping
from typing import Any

from transformers import TrainerCallback

from trials.contract import Knobs
from tuner.errors import ConfigError
from tuner.job.space import config_key
from tuner.python_api import BestConfig, best_config
from tuner.records import Fidelity, ProbeRow, ProbeStatus, is_stable
from tuner.records.production import ProductionResult
from tuner.settings import load_settings
from tuner.storage import Store

# The hf export's keys a tuned config sets; the job's keys it must agree on.
TUNED_KEYS = (
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "activation_checkpointing",
    "gradient_checkpointing",
    "per_device_eval_batch_size",
    "deepspeed",
)
JOB_KEYS = ("bf16", "fp16", "predict_with_generate")


def tuned_changes(export: Mapping[str, Any], current: Mapping[str, Any], fields: set[str]) -> dict[str, Any]:
    """The TrainingArguments fields to set from an hf export: its tuned keys this class has. Checkpointing goes to
    the name the class uses, the deprecated alias cleared (transformers 5 copies a set alias over the new name).
    Raises ConfigError naming a job setting where ``current`` differs from the study's job."""
    for key in JOB_KEYS:
        if key in export and key in current and bool(export[key]) != bool(current[key]):
            raise ConfigError(
                f"your training args have {key}={current[key]!r} but the study was tuned for {key}={export[key]!r}; "
                "tune a study with your job's settings, or set it as the study has it"
            )
    out = {k: export[k] for k in TUNED_KEYS if k in export and k in fields}
    ckpt = export.get("activation_checkpointing", export.get("gradient_checkpointing"))
    if ckpt is not None and "activation_checkpointing" in fields:
        out["activation_checkpointing"], out["gradient_checkpointing"] = bool(ckpt), False
    elif ckpt is not None:
        out["gradient_checkpointing"] = bool(ckpt)
    if "deepspeed" in fields and "deepspeed" not in export:
        out["deepspeed"] = None  # the tuned config runs plain PyTorch
    return out


def apply_best(training_args: Any, study: str | None = None, storage: str | None = None) -> Any:
    """A copy of ``training_args`` ((Seq2Seq)TrainingArguments) with the study's best config set; every other field
    as you had it."""
    best = best_config(study, storage=storage, format="hf")
    fields = {f.name for f in dataclasses.fields(training_args) if f.init}
    current = {name: getattr(training_args, name) for name in JOB_KEYS if name in fields}
    return dataclasses.replace(training_args, **tuned_changes(best.as_dict(), current, fields))


def run_knobs(best: BestConfig, args: Any) -> tuple[dict[str, Any], int, int]:
    """The knobs, world size and accumulation this run used: the study's config with what the args say."""
    ckpt = bool(getattr(args, "activation_checkpointing", False) or getattr(args, "gradient_checkpointing", False))
    knobs = {**best.knobs, "micro_batch_size": int(args.per_device_train_batch_size), "gradient_checkpointing": ckpt}
    return knobs, int(getattr(args, "world_size", 1) or 1), int(args.gradient_accumulation_steps)


@dataclasses.dataclass
class _Memory:
    device: str
    peak_allocated: int
    peak_reserved: int
    capacity: int | None


def _memory(baseline_rss: int) -> _Memory:
    import torch

    if torch.cuda.is_available():
        device = torch.cuda.current_device()
        return _Memory(
            device=torch.cuda.get_device_name(device),
            peak_allocated=int(torch.cuda.max_memory_allocated(device)),
            peak_reserved=int(torch.cuda.max_memory_reserved(device)),
            capacity=int(torch.cuda.get_device_properties(device).total_memory),
        )
    from trials.memory import peak_rss

    rss = max(0, peak_rss() - baseline_rss)  # host memory above the process's size at train begin
    return _Memory(device="cpu", peak_allocated=rss, peak_reserved=rss, capacity=None)


def _is_oom(exc: BaseException) -> bool:
    import torch

    text = str(exc).lower()  # CUDA: "CUDA out of memory"; CPU: "DefaultCPUAllocator: can't allocate memory"
    return (
        isinstance(exc, (torch.OutOfMemoryError, MemoryError)) or "out of memory" in text or "allocate memory" in text
    )


class TunerCallback(TrainerCallback):
    """Records this training run into ``study`` as a production row of the config it ran (one row per rank).

    Example (the study of the ``tuner.tune`` example; ``model`` and ``train_dataset`` are your own)::

        >>> from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments
        >>> from tuner.integrations.transformers import TunerCallback, apply_best
        >>> mine = Seq2SeqTrainingArguments(output_dir="out", max_steps=4, use_cpu=True, report_to=[])
        >>> args = apply_best(mine, study="quick", storage="sqlite:///tuner.db")
        >>> callback = TunerCallback("quick", storage="sqlite:///tuner.db")
        >>> trainer = Seq2SeqTrainer(model=model, args=args, train_dataset=train_dataset, callbacks=[callback])
        >>> _ = trainer.train()
        >>> from tuner.storage import Store
        >>> [(r.status.value, r.config_key == callback.best.config_key) for r in Store("sqlite:///tuner.db").probes(
        ...     "quick") if r.fidelity == "production"]
        [('ok', True)]
    """

    def __init__(self, study: str | None = None, storage: str | None = None) -> None:
        self.storage = load_settings(storage=storage).storage
        self.best = best_config(study, storage=self.storage, format="json")
        self.study = self.best.study
        self.step_times: list[float] = []
        self.phase = "train"
        self._t: float | None = None
        self._args: Any = None
        self._baseline_rss = 0
        self._recorded = False
        self._hook: Any = None

    # -- the Trainer's events ---------------------------------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        import torch

        from trials.memory import current_rss

        self._args = args
        self._baseline_rss = current_rss()
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        previous = sys.excepthook

        def hook(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
            if not self._recorded:
                self.record_failure(exc)
            previous(kind, exc, tb)

        self._hook = hook
        sys.excepthook = hook

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._t = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._t is not None:
            self.step_times.append(time.perf_counter() - self._t)

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.phase = "train"  # evaluation finished; a later failure is in training again

    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.phase = "eval"

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._record(ProbeStatus.OK, None)
        if self._hook is not None and sys.excepthook is self._hook:
            sys.excepthook = sys.__excepthook__

    # -- recording --------------------------------------------------------------------------------------------------
    def record_failure(self, exc: BaseException) -> None:
        """Records the run as failed (an out-of-memory error: ``oom``); called by the uncaught-exception hook, or by
        you around ``trainer.train()``."""
        status = ProbeStatus.OOM if _is_oom(exc) else ProbeStatus.ERROR
        self._record(status, f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}")

    def _record(self, status: ProbeStatus, cause: str | None) -> None:
        if self._recorded or self._args is None:
            return
        self._recorded = True
        knobs, world, accum = run_knobs(self.best, self._args)
        mem = _memory(self._baseline_rss)
        steps = self.step_times[1:] or self.step_times  # the first step holds one-off setup
        step_s = statistics.median(steps) if steps else None
        samples = knobs["micro_batch_size"] * accum * world / step_s if step_s else None
        headroom = Store(self.storage).require_definition(self.study).headroom
        row = ProbeRow(
            config_key=config_key(Knobs.model_validate(knobs), world, accum),
            fidelity=Fidelity.PRODUCTION,
            status=status,
            knobs=knobs,
            config={
                "world_size": world,
                "gradient_accumulation_steps": accum,
                "tuned_config_key": self.best.config_key,
            },
            cause=cause,
            samples_per_s=samples if status == ProbeStatus.OK else None,
            peak_allocated=mem.peak_allocated,
            peak_reserved=mem.peak_reserved,
            capacity=mem.capacity,
            stable=is_stable(status.value, mem.peak_reserved, mem.capacity, headroom, 0),  # reserved: the need
            result=ProductionResult(
                rank=int(os.environ.get("RANK", "0")),
                device=mem.device,
                steps=len(self.step_times),
                step_s=step_s,
                phase=self.phase if status != ProbeStatus.OK else None,
                memory="cuda max_memory_allocated" if mem.capacity else "host peak RSS above train begin",
            ).to_json(),
            study_name=self.study,
        )
        Store(self.storage).record_probe(row)
