"""The user's current setup as trial 0: a DeepSpeed JSON (HF-style "auto" allowed) and/or a TrainingArguments JSON,
parsed, checked and mapped onto the knobs (reading the files: tuner.interop.baseline_files).

"auto" is resolved the way the user's HF Trainer does it (transformers' HfTrainerDeepSpeedConfig, of the release they
train with: tuner.interop.trainer_fill): from the training arguments, with TrainingArguments' defaults for fields the
JSON leaves out; an explicit DeepSpeed value that the
arguments contradict is an error here, as it would be in the Trainer. Every problem is a BaselineError naming the
field. The DeepSpeed JSON is read and checked as DeepSpeed reads it (tuner.interop.ds_json). Pure code: no torch.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from pydantic import ValidationError

from trials.contract import BUCKET_KNOBS, Knobs
from tuner.errors import BaselineError
from tuner.interop.baseline_fsdp import NO_BATCH_IN_ACCELERATE, fsdp_import
from tuner.interop.baseline_plugin import config_world, is_deepspeed, plugin_import
from tuner.interop.ds_json import as_bool, as_int, batch_fields, check_ds_keys, dotted, ds_value
from tuner.interop.export.mapping import (
    AUTO,
    DS_PATH,
    HF_ARGS,
    HF_CHECKPOINTING_KEYS,
    HF_DEFAULTS,
    HF_DS_FILL,
    PRECISION_BLOCKS,
    auto_paths,
    decode_offload,
    decode_offload_param,
    decode_precision,
    get_path,
    set_path,
)
from tuner.interop.trainer_fill import (
    TrainerFill,
    TrainerFix,
    apply_fixes,
    parse_version,
    trainer_fill,
    trainer_fixes,
)
from tuner.job.definition import HF_MAX_LENGTH_KEYS
from tuner.job.evaluation import evaluates
from tuner.job.ledger.accelerate import read_accelerate
from tuner.job.ledger.deepspeed import read_deepspeed
from tuner.job.ledger.held import read_training_args


@dataclass(frozen=True)
class Baseline:
    knobs: dict[str, Any]  # a full Knobs dict (trials.contract.Knobs(**knobs) validates)
    global_batch: int | None  # train_batch_size: micro x accumulation x world (None when the world size is unknown)
    world_size: int | None
    gradient_accumulation_steps: int
    # the user's DeepSpeed JSON, "auto" filled where the training args resolve it, as their Trainer fills it: what
    # trial 0 runs (a value DeepSpeed refuses stays, and the probe is refused before it starts)
    ds_config: dict[str, Any]
    hf_args: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # how each default or "auto" was resolved
    ds_given: dict[str, Any] | None = None  # the user's DeepSpeed JSON as given ("auto" kept)
    transformers: str | None = None  # the release whose Trainer filled ds_config (tuner.interop.trainer_fill)
    fixes: list[dict[str, Any]] = field(default_factory=list)  # TrainerFix as JSON: what the exports write
    # an FSDP2 baseline (knobs engine fsdp2): the settings every probe holds (trials.contract.FsdpSettings as JSON),
    # and the user's accelerate config as given when that is where they wrote them
    fsdp: dict[str, Any] | None = None
    accelerate_given: dict[str, Any] | None = None
    # the training args through the ledger (tuner.job.ledger.held): what the probe's TrainingArguments are built from,
    # whether they are Seq2SeqTrainingArguments, and the keys kept without a probe (key -> why they change nothing)
    trainer_args: dict[str, Any] | None = None
    seq2seq_args: bool = False
    kept: dict[str, str] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)  # strict=False (tuner doctor): key -> the refusal's line
    compile: dict[str, Any] | None = None  # torch.compile's keywords from their accelerate config's dynamo_config
    args_yaml: bool = False  # their training-args file (a TRL recipe) was YAML: the recipe export writes YAML back

    def files(self) -> dict[str, Any]:
        """The user's files as given, what an export starts from (tuner.interop.export.own.UserFiles)."""
        files: dict[str, Any] = {"deepspeed": self.ds_given, "training_args": self.hf_args or None}
        files |= {"accelerate": self.accelerate_given} if self.accelerate_given is not None else {}
        return files | ({"training_args_format": "yaml"} if self.args_yaml else {})

    def trainer_fixes(self) -> list[TrainerFix]:
        return [TrainerFix.from_dict(f) for f in self.fixes]

    def probe_source(self) -> dict[str, Any]:
        """The DeepSpeed JSON every probe of the search builds on, as the exports give it to the user's Trainer:
        ``ds_config`` with the fixes their Trainer needs written (tuner.interop.trainer_fill)."""
        return apply_fixes(self.ds_config, self.trainer_fixes(), "deepspeed")

    def trainer(self) -> dict[str, Any]:
        """The study definition's ``trainer`` part: the release the baseline was filled for and its fixes."""
        return {"transformers": self.transformers, "fixes": list(self.fixes)}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Baseline:
        return cls(**dict(data))


class _Hf:
    """Training-args values with TrainingArguments' defaults (a TRL recipe's own) for what the JSON leaves out."""

    def __init__(self, args: Mapping[str, Any] | None) -> None:
        self.given = dict(args or {})
        self.present = args is not None
        self.defaults: dict[str, Any] = {}  # a TRL recipe's changed defaults (tuner.job.ledger.trl)

    def __call__(self, key: str) -> Any:
        return self.given.get(key, self.defaults.get(key, HF_DEFAULTS.get(key)))

    def int(self, key: str, minimum: int = 1) -> int:
        return as_int(f"training args {key}", self(key), minimum)

    def bool(self, key: str) -> bool:
        return as_bool(f"training args {key}", self(key))


def _resolve_autos(ds: dict[str, Any], hf: _Hf, hidden_size: int | None, notes: list[str], fill: TrainerFill) -> None:
    """Fills "auto" like ``fill``'s HfTrainerDeepSpeedConfig; what nothing resolves stays "auto"."""
    pairs: list[tuple[tuple[str, ...], Any]] = [
        (DS_PATH["micro_batch_size"], hf(HF_ARGS["micro_batch_size"])),
        (("gradient_accumulation_steps",), hf("gradient_accumulation_steps")),
        (("fp16", "enabled"), bool(hf("fp16") or hf("fp16_full_eval"))),
        (("bf16", "enabled"), bool(hf("bf16") or hf("bf16_full_eval"))),
        (("scheduler", "params", "warmup_min_lr"), 0),
    ]
    max_steps = hf("max_steps")
    steps = max_steps if isinstance(max_steps, int) and not isinstance(max_steps, bool) and max_steps > 0 else None
    for path, keys in HF_DS_FILL:
        if keys == ("max_steps",):
            pairs.append((path, steps))
        elif keys == ("warmup_steps",):
            pairs.append((path, fill.warmup({**HF_DEFAULTS, **hf.given}, steps)))
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
            notes.append(f"{'.'.join(path)}: 'auto' -> {value!r} (from the training args, as {fill.named} fills it)")


def _mismatch(ds: Mapping[str, Any], hf: _Hf) -> None:
    """Explicit DeepSpeed values the training args contradict (the Trainer refuses these too)."""
    checks = [
        (dotted("micro_batch_size"), HF_ARGS["micro_batch_size"], hf(HF_ARGS["micro_batch_size"])),
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
    transformers_version: str | None = None,
    accelerate: Mapping[str, Any] | None = None,
    strict: bool = True,
) -> Baseline:
    """Maps a DeepSpeed config and/or training args onto the knobs, "auto" filled as the Trainer of
    ``transformers_version`` fills it (None: this host's release). ``world_size`` (the study's) checks
    train_batch_size; ``hidden_size`` resolves the model-sized "auto" buckets as the Trainer would; ``max_length``
    is used when the training args name no length (max_source_length, max_seq_length, max_length); with neither, the
    default search space's max_length (noted in ``notes``). Every DeepSpeed and TrainingArguments name is read from
    tuner.interop.export.mapping's tables, the ones the exports write with. An FSDP2 setup (training args with
    ``fsdp``, or ``accelerate``: the user's accelerate config with an ``fsdp_config``, beside their training args)
    is read by tuner.interop.baseline_fsdp: engine fsdp2 and the settings every probe holds. Every key of the
    training args goes through the ledger (tuner.job.ledger.held): a refused one is a BaselineError, or with
    ``strict=False`` (tuner doctor) kept in ``Baseline.refused``."""
    if accelerate is not None and not isinstance(accelerate, Mapping):
        raise BaselineError(f"the accelerate config must be a mapping, got {type(accelerate).__name__}")
    if accelerate is not None and hf_args is None:
        raise BaselineError(NO_BATCH_IN_ACCELERATE)
    accel = read_accelerate(accelerate) if accelerate is not None else None
    notes: list[str] = []
    if accelerate is not None and hf_args is not None and is_deepspeed(accelerate):  # accelerate's DeepSpeed plugin
        plugin = plugin_import(accelerate, hf_args, ds_config)
        ds_config, notes = plugin.ds or ds_config, plugin.notes
        world_size = config_world(world_size, plugin.world_size)
    ds_config, hf = _inputs(ds_config, hf_args)
    fill = trainer_fill(transformers_version)
    held = read_training_args(hf.given, transformers_version, strict) if hf.present else None
    hf.defaults, notes = (dict(held.recipe.defaults), notes + held.recipe.notes()) if held else ({}, notes)
    fsdp_from = None if is_deepspeed(accelerate) else accelerate
    fsdp = fsdp_import(fsdp_from, hf.given if hf.present else None, ds_config is not None, fsdp_default(fill.version))
    if fsdp is not None:
        notes += fsdp.notes
        world_size = config_world(world_size, fsdp.world_size)
    ds = _checked_ds(ds_config, hf, hidden_size, notes, fill)
    micro, accum, world, global_batch = batch_fields(ds, world_size)
    if ds.get("train_batch_size") == AUTO and world is not None and global_batch is not None:
        ds["train_batch_size"] = global_batch
        notes.append(f"train_batch_size: 'auto' -> {global_batch} (micro x accumulation x {world} ranks)")
    if hf.present:
        notes += [f"{p}: stays 'auto' (the Trainer fills it at run time)" for p in auto_paths(ds)]
    knobs = {
        "micro_batch_size": micro,
        "max_length": _length(hf, max_length, notes),
        **_ds_knobs(ds, notes),
        **_hf_knobs(hf),
        "precision": decode_precision(ds) if ds_config is not None else _hf_precision(hf),
        "engine": "deepspeed" if ds_config is not None else "torch",
        "alloc_conf": None,
    }
    if fsdp is not None:  # the training args' own precision wins over the accelerate config's, as in TrainingArguments
        precision = knobs["precision"] if knobs["precision"] != "fp32" else fsdp.precision or "fp32"
        knobs = {**knobs, **fsdp.knobs, "engine": "fsdp2", "precision": precision}
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
        transformers=fill.version,
        fixes=[f.to_dict() for f in trainer_fixes(ds_config, hf_args if hf.present else None, fill)],
        fsdp=fsdp.held.model_dump(mode="json") if fsdp is not None else None,
        accelerate_given=copy.deepcopy(dict(accelerate)) if accelerate is not None else None,
        trainer_args=copy.deepcopy(held.trainer) if held is not None else None,
        seq2seq_args=held.seq2seq if held is not None else False,
        kept={
            **(held.neutral if held is not None else {}),
            **(accel.kept if accel is not None else {}),
            **(read_deepspeed(ds) if ds_config is not None else {}),
        },
        refused=dict(held.refused) if held is not None else {},
        compile=accel.compile if accel is not None else None,
    )


def fsdp_default(transformers_version: str | None) -> int:
    """The FSDP version TrainingArguments' ``fsdp`` runs in a release when fsdp_config names none: 2 from
    transformers 5 (``fsdp_config.get("version", 2)``), 1 before (4.57's TrainingArguments leave it to accelerate's
    plugin, whose default is FSDP1)."""
    parsed = parse_version(transformers_version)
    return 1 if parsed is not None and parsed < (5, 0) else 2


def _inputs(
    ds_config: Mapping[str, Any] | None, hf_args: Mapping[str, Any] | None
) -> tuple[Mapping[str, Any] | None, _Hf]:
    """The DeepSpeed JSON (given, or embedded in the training args) and the training args, checked to be objects."""
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
    return ds_config, hf


def _checked_ds(
    ds_config: Mapping[str, Any] | None, hf: _Hf, hidden_size: int | None, notes: list[str], fill: TrainerFill
) -> dict[str, Any]:
    """The user's DeepSpeed JSON checked, "auto" resolved from the training args (none: the args' batch fields)."""
    ds = copy.deepcopy(dict(ds_config or {}))
    if "bfloat16" in ds and PRECISION_BLOCKS["bf16"] not in ds:
        ds[PRECISION_BLOCKS["bf16"]] = ds.pop("bfloat16")
    check_ds_keys(ds)
    read_deepspeed(ds)  # the ledger's refusals (pipeline / tensor parallelism, elastic batches, curricula ...)
    if ds_config is None:
        set_path(ds, DS_PATH["micro_batch_size"], hf.int(HF_ARGS["micro_batch_size"]))
        ds["gradient_accumulation_steps"] = hf.int("gradient_accumulation_steps")
        if hf.bool("fp16") and hf.bool("bf16"):
            raise BaselineError("training args fp16 and bf16 are both true; choose one")
        return ds
    if hf.present:
        _mismatch(ds, hf)
        _resolve_autos(ds, hf, hidden_size, notes, fill)
    elif auto_paths(ds):
        raise BaselineError(
            f"the DeepSpeed config has 'auto' values ({', '.join(auto_paths(ds))}) and no "
            "training-args JSON resolves them; give your training args too (`tuner search --training-args FILE`, "
            "training_args in POST /studies) or write numbers"
        )
    if all(get_path(ds, (block, "enabled")) is True for block in PRECISION_BLOCKS.values()):
        raise BaselineError("fp16.enabled and bf16.enabled are both true; DeepSpeed allows one of them")
    return ds


def _length(hf: _Hf, max_length: int | None, notes: list[str]) -> int:
    """The probe's max_length: the training args' own, else ``max_length``, else the default space's."""
    length = next((hf.given[k] for k in HF_MAX_LENGTH_KEYS if hf.given.get(k) is not None), None)
    if length is not None:
        return as_int("training args max length", length)
    if max_length is not None:
        length = as_int("max_length", max_length)
        notes.append(f"max_length: {length} (none in the training args)")
        return length
    # A DeepSpeed JSON says nothing about lengths: probe at the length the default search space uses, so trial 0
    # and the trials compare at the same shapes. max_source_length in the training args overrides it.
    from tuner.job.space import default_space

    length = max(default_space().max_length)
    notes.append(
        f"max_length: {length} (the default space's; give training args with max_source_length or "
        "max_seq_length to probe your own)"
    )
    return int(length)


def _ds_knobs(ds: Mapping[str, Any], notes: list[str]) -> dict[str, Any]:
    """The knobs a DeepSpeed JSON sets (ZeRO stage, buckets, overlap, contiguous gradients, offload), at the paths of
    DS_PATH, with DeepSpeed's defaults where it sets none."""
    stage = ds_value(ds, "zero_stage", 0)
    overlap = ds_value(ds, "overlap_comm")
    contiguous = ds_value(ds, "contiguous_gradients", True)
    return {
        "zero_stage": stage,
        **{key: _bucket(ds, key, notes) for key in BUCKET_KNOBS},
        "overlap_comm": as_bool(dotted("overlap_comm"), overlap) if overlap is not None else stage == 3,
        "contiguous_gradients": as_bool(dotted("contiguous_gradients"), contiguous),
        "offload_optimizer": decode_offload(ds),
        "offload_param": stage == 3 and decode_offload_param(ds),  # DeepSpeed reads it under ZeRO-3 only
        **(_zero_pp(ds) if stage == 3 else {}),
    }


def _zero_pp(ds: Mapping[str, Any]) -> dict[str, Any]:
    """A ZeRO-3 JSON's ZeRO++ (hpZ's partition size, quantized weights / gradients): trial 0 runs them as given."""
    hpz = ds_value(ds, "zero_hpz_partition_size")
    return {
        "zero_hpz_partition_size": as_int(dotted("zero_hpz_partition_size"), hpz) if hpz not in (None, 1) else None,
        "zero_quantized_weights": as_bool(
            dotted("zero_quantized_weights"), ds_value(ds, "zero_quantized_weights", False)
        ),
        "zero_quantized_gradients": as_bool(
            dotted("zero_quantized_gradients"), ds_value(ds, "zero_quantized_gradients", False)
        ),
    }


def _bucket(ds: Mapping[str, Any], key: str, notes: list[str]) -> int | None:
    value = ds_value(ds, key)
    if value == AUTO:
        how = (
            "the probe resolves it from the model as the Trainer does"
            if key == "reduce_bucket_size"
            else "the Trainer does not fill it; DeepSpeed's default used"
        )
        notes.append(f"{dotted(key)}: 'auto' (no model hidden size here): {how}")
        return None
    return None if value is None else as_int(dotted(key), value)


def _hf_knobs(hf: _Hf) -> dict[str, Any]:
    """The knobs training args set (checkpointing; the eval batch and generate, when they evaluate)."""
    given = (hf.given[k] for k in HF_CHECKPOINTING_KEYS if hf.given.get(k) is not None)
    checkpointing = next(given, hf.defaults.get("gradient_checkpointing", False))
    evaluating = hf.present and evaluates(hf.given)
    return {
        "gradient_checkpointing": as_bool("training args gradient_checkpointing", checkpointing),
        "eval_batch_size": hf.int(HF_ARGS["eval_batch_size"]) if evaluating else None,
        "generate": hf.bool(HF_ARGS["generate"]) if evaluating else False,
    }


def _hf_precision(hf: _Hf) -> str:
    return "bf16" if hf.bool("bf16") else "fp16" if hf.bool("fp16") else "fp32"
