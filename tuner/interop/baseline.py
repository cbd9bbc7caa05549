"""The user's current setup as trial 0: a DeepSpeed JSON (HF-style "auto" allowed) and/or a TrainingArguments JSON,
parsed, checked and mapped onto the knobs (reading the files: tuner.interop.baseline_files).

"auto" is resolved the way the HF Trainer does it (transformers' HfTrainerDeepSpeedConfig): from the training
arguments, with TrainingArguments' defaults for fields the JSON leaves out; an explicit DeepSpeed value that the
arguments contradict is an error here, as it would be in the Trainer. Every problem is a BaselineError naming the
field. Pure code: no torch import.
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from pydantic import ValidationError

from trials.contract import BUCKET_KNOBS, Knobs
from tuner.errors import BaselineError
from tuner.interop.export.mapping import (
    AUTO,
    DS_KNOWN_TOP,
    HF_DEFAULTS,
    HF_DS_FILL,
    ZERO_KEYS,
    auto_paths,
    get_path,
    set_path,
)
from tuner.job.definition import HF_MAX_LENGTH_KEYS


@dataclass(frozen=True)
class Baseline:
    knobs: dict[str, Any]  # a full Knobs dict (trials.contract.Knobs(**knobs) validates)
    global_batch: int | None  # train_batch_size: micro x accumulation x world (None when the world size is unknown)
    world_size: int | None
    gradient_accumulation_steps: int
    ds_config: dict[str, Any]  # the user's DeepSpeed JSON, "auto" filled where the training args resolve it
    hf_args: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # how each default or "auto" was resolved
    ds_given: dict[str, Any] | None = None  # the user's DeepSpeed JSON as given ("auto" kept)

    def files(self) -> dict[str, Any]:
        """The user's files as given, what an export starts from: {"deepspeed": ..., "training_args": ...}."""
        return {"deepspeed": self.ds_given, "training_args": self.hf_args or None}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Baseline:
        return cls(**dict(data))


def _nearest(key: str, known: set[str] | frozenset[str]) -> str:
    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _int(where: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # 2e8 in a JSON file is a float
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise BaselineError(f"{where} must be an integer >= {minimum}, got {value!r}")
    return value


def _bool(where: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise BaselineError(f"{where} must be true or false, got {value!r}")
    return value


class _Hf:
    """Training-args values with TrainingArguments' defaults for what the JSON leaves out."""

    def __init__(self, args: Mapping[str, Any] | None) -> None:
        self.given = dict(args or {})
        self.present = args is not None

    def __call__(self, key: str) -> Any:
        return self.given.get(key, HF_DEFAULTS.get(key))

    def int(self, key: str, minimum: int = 1) -> int:
        return _int(f"training args {key}", self(key), minimum)

    def bool(self, key: str) -> bool:
        return _bool(f"training args {key}", self(key))


def _check_ds_keys(ds: Mapping[str, Any]) -> dict[str, Any]:
    for key in ds:
        if key not in DS_KNOWN_TOP and _nearest(key, DS_KNOWN_TOP):
            raise BaselineError(f"unknown DeepSpeed key {key!r}{_nearest(key, DS_KNOWN_TOP)}")
    zero = ds.get("zero_optimization", {})
    if not isinstance(zero, dict):
        raise BaselineError(f"zero_optimization must be an object, got {zero!r}")
    for key in zero:
        if key not in ZERO_KEYS:
            raise BaselineError(
                f"unknown key zero_optimization.{key}{_nearest(key, ZERO_KEYS)}; DeepSpeed rejects it too"
            )
    stage = zero.get("stage", 0)
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        raise BaselineError(f"zero_optimization.stage must be 0, 1, 2 or 3, got {stage!r}")
    for name in ("offload_optimizer", "offload_param"):
        block = zero.get(name)
        if block is not None and (
            not isinstance(block, dict) or block.get("device", "none") not in ("none", "cpu", "nvme")
        ):
            raise BaselineError(f"zero_optimization.{name} must be an object with device none, cpu or nvme")
    if get_path(zero, ("offload_optimizer", "device")) == "nvme":
        raise BaselineError(
            "zero_optimization.offload_optimizer.device 'nvme' is not a knob the tuner probes; "
            "use 'cpu' or 'none' in the baseline"
        )
    if get_path(zero, ("offload_param", "device")) in ("cpu", "nvme") or zero.get("cpu_offload_param"):
        raise BaselineError(
            "zero_optimization.offload_param is not a knob the tuner probes yet; set its device to "
            "'none' in the baseline (parameter offload trades much speed for memory)"
        )
    for block in ("fp16", "bf16", "bfloat16"):
        value = ds.get(block)
        if value is not None and not (isinstance(value, dict) and value.get("enabled", False) in (True, False, AUTO)):
            raise BaselineError(f'{block} must be an object like {{"enabled": true}}, got {value!r}')
    return zero


def _resolve_autos(ds: dict[str, Any], hf: _Hf, hidden_size: int | None, notes: list[str]) -> None:
    """Fills "auto" like HfTrainerDeepSpeedConfig; what nothing resolves stays "auto"."""
    pairs: list[tuple[tuple[str, ...], Any]] = [
        (("train_micro_batch_size_per_gpu",), hf("per_device_train_batch_size")),
        (("gradient_accumulation_steps",), hf("gradient_accumulation_steps")),
        (("fp16", "enabled"), bool(hf("fp16") or hf("fp16_full_eval"))),
        (("bf16", "enabled"), bool(hf("bf16") or hf("bf16_full_eval"))),
        (("scheduler", "params", "warmup_min_lr"), 0),
    ]
    max_steps = hf("max_steps")
    warmup = hf("warmup_steps")
    for path, keys in HF_DS_FILL:
        if keys == ("max_steps",):
            pairs.append((path, max_steps if isinstance(max_steps, int) and max_steps > 0 else None))
        elif keys == ("warmup_steps",):
            steps = (
                warmup
                if isinstance(warmup, int)
                else (
                    int(warmup * max_steps)
                    if isinstance(warmup, float) and isinstance(max_steps, int) and max_steps > 0
                    else None
                )
            )
            pairs.append((path, None if steps is None else max(1, steps)))
        else:
            value = [hf(k) for k in keys] if len(keys) > 1 else hf(keys[0])
            pairs.append((path, value))
    if hidden_size:
        pairs += [
            (("zero_optimization", "reduce_bucket_size"), hidden_size * hidden_size),
            (("zero_optimization", "stage3_prefetch_bucket_size"), int(0.9 * hidden_size * hidden_size)),
            (("zero_optimization", "stage3_param_persistence_threshold"), 10 * hidden_size),
        ]
    for path, value in pairs:
        if get_path(ds, path) == AUTO and value is not None:
            set_path(ds, path, value)
            notes.append(f"{'.'.join(path)}: 'auto' -> {value!r} (from the training args)")


def _batch(ds: Mapping[str, Any], world_size: int | None) -> tuple[int, int, int | None, int | None]:
    """(micro, accumulation, world, global) by DeepSpeed's own rules for the batch fields it was given."""
    tbs, micro, accum = (
        ds.get(k) for k in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
    )
    tbs = None if tbs in (None, AUTO) else _int("train_batch_size", tbs)
    micro = None if micro is None else _int("train_micro_batch_size_per_gpu", micro)
    accum = None if accum is None else _int("gradient_accumulation_steps", accum)
    if micro is None and tbs is None:
        raise BaselineError(
            "the baseline gives no batch size: set train_micro_batch_size_per_gpu (DeepSpeed) or "
            "per_device_train_batch_size (training args)"
        )
    if tbs is not None and micro is not None and accum is not None and world_size is None:
        if tbs % (micro * accum):
            raise BaselineError(
                f"train_batch_size={tbs} is not micro x accumulation x world size: {micro} x {accum} "
                f"does not divide it; fix train_batch_size or set it to 'auto'"
            )
        world_size = tbs // (micro * accum)
    if tbs is not None and (micro is None or accum is None):
        if world_size is None:
            raise BaselineError(
                "train_batch_size without both train_micro_batch_size_per_gpu and "
                "gradient_accumulation_steps needs the world size; give the missing field"
            )
        if micro is None:
            accum = accum or 1
            micro, rest = divmod(tbs, accum * world_size)
        else:
            accum, rest = divmod(tbs, micro * world_size)
        if rest or not micro or not accum:
            raise BaselineError(
                f"train_batch_size={tbs} does not split into micro batch x accumulation x "
                f"{world_size} ranks; fix train_batch_size"
            )
    accum = accum or 1
    if micro is None:  # unreachable: no micro batch and no train_batch_size was refused above
        raise BaselineError("the baseline gives no micro batch size; set train_micro_batch_size_per_gpu")
    if tbs is not None and world_size is not None and tbs != micro * accum * world_size:
        raise BaselineError(
            f"train_batch_size={tbs} contradicts train_micro_batch_size_per_gpu x "
            f"gradient_accumulation_steps x world size = {micro} x {accum} x {world_size} = "
            f"{micro * accum * world_size}; fix one of them or set train_batch_size to 'auto'"
        )
    return micro, accum, world_size, (micro * accum * world_size if world_size else tbs)


def _mismatch(ds: Mapping[str, Any], hf: _Hf) -> None:
    """Explicit DeepSpeed values the training args contradict (the Trainer refuses these too)."""
    checks = [
        ("train_micro_batch_size_per_gpu", "per_device_train_batch_size", hf("per_device_train_batch_size")),
        ("gradient_accumulation_steps", "gradient_accumulation_steps", hf("gradient_accumulation_steps")),
        ("fp16.enabled", "fp16", bool(hf("fp16") or hf("fp16_full_eval"))),
        ("bf16.enabled", "bf16", bool(hf("bf16") or hf("bf16_full_eval"))),
    ]
    for ds_key, hf_key, hf_value in checks:
        value = get_path(ds, ds_key.split("."))
        if value is not None and value != AUTO and value != hf_value:
            default = "" if hf_key in hf.given else " (its default)"
            raise BaselineError(
                f"DeepSpeed {ds_key}={value!r} contradicts training args {hf_key}={hf_value!r}{default} "
                "(the HF Trainer refuses this too); make them equal or set the DeepSpeed one to 'auto'"
            )


def parse_baseline(
    ds_config: Mapping[str, Any] | None,
    hf_args: Mapping[str, Any] | None,
    *,
    world_size: int | None = None,
    hidden_size: int | None = None,
    max_length: int | None = None,
) -> Baseline:
    """Maps a DeepSpeed config and/or training args onto the knobs. ``world_size`` (the study's) checks
    train_batch_size; ``hidden_size`` resolves the model-sized "auto" buckets as the Trainer would; ``max_length``
    is used when the training args name no length (max_source_length, max_seq_length, max_length); with neither, the
    default search space's max_length (noted in ``notes``)."""
    if ds_config is None and hf_args is None:
        raise BaselineError("a baseline needs a DeepSpeed config and/or a training-args JSON")
    for name, value in (("DeepSpeed config", ds_config), ("training args", hf_args)):
        if value is not None and not isinstance(value, Mapping):
            raise BaselineError(f"the {name} must be a JSON object, got {type(value).__name__}")
    hf = _Hf(hf_args)
    inline = hf.given.get("deepspeed")
    if ds_config is None and isinstance(inline, Mapping):
        ds_config = inline
    elif ds_config is None and isinstance(inline, str):
        raise BaselineError(f"training args name deepspeed={inline!r}; pass that file as the DeepSpeed config too")
    notes: list[str] = []
    ds = copy.deepcopy(dict(ds_config or {}))
    if "bfloat16" in ds and "bf16" not in ds:
        ds["bf16"] = ds.pop("bfloat16")
    zero = _check_ds_keys(ds)
    if ds_config is not None:
        if hf.present:
            _mismatch(ds, hf)
            _resolve_autos(ds, hf, hidden_size, notes)
        elif auto_paths(ds):
            raise BaselineError(
                f"the DeepSpeed config has 'auto' values ({', '.join(auto_paths(ds))}) and no "
                "training-args JSON resolves them; give your training args too (`tuner search --training-args FILE`, "
                "training_args in POST /studies) or write numbers"
            )
        if get_path(ds, ("fp16", "enabled")) is True and get_path(ds, ("bf16", "enabled")) is True:
            raise BaselineError("fp16.enabled and bf16.enabled are both true; DeepSpeed allows one of them")
    else:
        ds["train_micro_batch_size_per_gpu"] = hf.int("per_device_train_batch_size")
        ds["gradient_accumulation_steps"] = hf.int("gradient_accumulation_steps")
        if hf.bool("fp16") and hf.bool("bf16"):
            raise BaselineError("training args fp16 and bf16 are both true; choose one")
    micro, accum, world, global_batch = _batch(ds, world_size)
    if ds.get("train_batch_size") == AUTO and world is not None and global_batch is not None:
        ds["train_batch_size"] = global_batch
        notes.append(f"train_batch_size: 'auto' -> {global_batch} (micro x accumulation x {world} ranks)")

    if hf.present:
        notes += [f"{p}: stays 'auto' (the Trainer fills it at run time)" for p in auto_paths(ds)]
    length = next((hf.given[k] for k in HF_MAX_LENGTH_KEYS if hf.given.get(k) is not None), None)
    if length is not None:
        length = _int("training args max length", length)
    elif max_length is not None:
        length = _int("max_length", max_length)
        notes.append(f"max_length: {length} (none in the training args)")
    else:
        # A DeepSpeed JSON says nothing about lengths: probe at the length the default search space uses, so trial 0
        # and the trials compare at the same shapes. max_source_length in the training args overrides it.
        from tuner.job.space import default_space

        length = max(default_space().max_length)
        notes.append(
            f"max_length: {length} (the default space's; give training args with max_source_length or "
            "max_seq_length to probe your own)"
        )

    stage = zero.get("stage", 0)
    if ds_config is None:
        precision = "bf16" if hf.bool("bf16") else "fp16" if hf.bool("fp16") else "fp32"
    else:
        precision = (
            "bf16"
            if get_path(ds, ("bf16", "enabled")) is True
            else ("fp16" if get_path(ds, ("fp16", "enabled")) is True else "fp32")
        )
    buckets = {}
    for key in BUCKET_KNOBS:
        value = zero.get(key)
        if value == AUTO:
            notes.append(
                f"zero_optimization.{key}: 'auto' (no model hidden size here): "
                + (
                    "the probe resolves it from the model as the Trainer does"
                    if key == "reduce_bucket_size"
                    else "the Trainer does not fill it; DeepSpeed's default used"
                )
            )
            value = None
        buckets[key] = None if value is None else _int(f"zero_optimization.{key}", value)
    overlap = zero.get("overlap_comm")
    offload = get_path(zero, ("offload_optimizer", "device")) == "cpu" or bool(zero.get("cpu_offload"))
    checkpointing = hf.given.get("activation_checkpointing")
    if checkpointing is None:  # transformers 5 renamed gradient_checkpointing; either spelling counts
        checkpointing = hf.given.get("gradient_checkpointing") or False
    eval_batch = hf.int("per_device_eval_batch_size") if hf.present else None
    knobs = {
        "micro_batch_size": micro,
        "max_length": length,
        "engine": "deepspeed" if ds_config is not None else "torch",
        "zero_stage": stage,
        **buckets,
        "overlap_comm": _bool("zero_optimization.overlap_comm", overlap) if overlap is not None else stage == 3,
        "contiguous_gradients": _bool("zero_optimization.contiguous_gradients", zero.get("contiguous_gradients", True)),
        "offload_optimizer": offload,
        "gradient_checkpointing": _bool("training args gradient_checkpointing", checkpointing),
        "precision": precision,
        "alloc_conf": None,
        "eval_batch_size": eval_batch,
        "generate": hf.bool("predict_with_generate") if hf.present else False,
    }
    try:
        knobs = Knobs.model_validate(knobs).model_dump()
    except ValidationError as err:
        first = err.errors()[0]
        raise BaselineError(
            f"the baseline maps to invalid knobs: {'.'.join(map(str, first['loc']))}: {first['msg']}"
        ) from None
    return Baseline(
        knobs=knobs,
        global_batch=global_batch,
        world_size=world,
        gradient_accumulation_steps=accum,
        ds_config=ds if ds_config is not None else {},
        hf_args=hf.given,
        notes=notes,
        ds_given=copy.deepcopy(dict(ds_config)) if ds_config is not None else None,
    )
