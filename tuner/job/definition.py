"""The user's job: what their training run does and must keep doing while the search varies speed-and-memory knobs.

Precision, the lengths (seq2seq: encoder input and labels; causal LM: one), the evaluation step (eval batch,
predict_with_generate, generation length, beams) and LoRA adapters (tuner.job.lora) come from the user and stay
fixed. Sources, later wins: built-in
defaults (for the built-in presets only), the baseline (their training args and DeepSpeed JSON), flags. A real model
with no known length is an error, never a silent default. The search space then keeps only the job's values of these
knobs (``fix_space``), except where a space file lists one on purpose. The eval batch is probed at the user's value:
searching below it (it changes speed and memory, not results) needs eval time in the objective, which the probe does
not measure yet, so a smaller eval batch is only tried when a space file lists eval_batch_size.

Pure: no torch, no storage.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trials.contract import FSDP_KNOBS, DpoSpec, JobSettings, LoraSpec, Precision, TrlHead
from trials.contract_job import PaddingFree
from tuner.declared import API, ESTIMATE, EXPLAIN, SEARCH, TUNE, setting
from tuner.errors import ConfigError
from tuner.job.evaluation import held_eval_batches
from tuner.job.ledger.trl import recipe_dpo, recipe_lora
from tuner.job.lora import LORA_FLAGS, lora_spec
from tuner.job.padding_free import padding_free_of
from tuner.job.space import KNOB_RANGES, Space
from tuner.job.trainer_line import trainer_parts
from tuner.job.trl_head import trl_head_of

_ALL = frozenset({SEARCH, TUNE, API, ESTIMATE, EXPLAIN})
_LOCAL = frozenset({SEARCH, TUNE, ESTIMATE, EXPLAIN})


class Job(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    precision: Precision
    max_length: int = Field(ge=1, le=KNOB_RANGES["max_length"][1])  # encoder input (seq2seq) or causal LM length
    max_target_length: int | None = Field(None, ge=1)  # seq2seq label length; None: max_length
    eval_batch_size: int | None = Field(None, ge=1, le=KNOB_RANGES["eval_batch_size"][1])  # None: no eval step
    generate: bool = False  # predict_with_generate
    generation_max_length: int | None = Field(None, ge=1)  # None: the label length
    num_beams: int = Field(1, ge=1)
    max_grad_norm: float = Field(1.0, ge=0)  # clipping of a job without DeepSpeed (TrainingArguments' default)
    lora: LoraSpec | None = None  # adapters on a frozen base (None: a full fine-tune)
    dpo: DpoSpec | None = None  # a DPO recipe's pairs and reference (tuner.job.ledger.trl; None: one row per sample)
    # the user's training args the probe runs (tuner.job.ledger.held: every field but those the probe sets itself)
    trainer_args: dict[str, Any] | None = None
    seq2seq_args: bool = False
    eval_held_batches: int = Field(0, ge=0)  # eval batches whose logits stay on the device (tuner.job.evaluation)
    compile: dict[str, Any] | None = None  # torch.compile's keywords from their accelerate config's dynamo_config
    padding_free: PaddingFree | None = None  # a TRL SFT recipe's padding-free batches (tuner.job.packing)
    trl_head: TrlHead | None = None  # TRL's fused LM head where TRL >= 1.16 is installed (tuner.job.trl_head)

    @property
    def evaluates(self) -> bool:
        return self.eval_batch_size is not None or self.generate

    def settings(self) -> JobSettings:
        """What a probe needs beside the knobs."""
        return JobSettings(
            max_target_length=self.max_target_length,
            generation_max_length=self.generation_max_length,
            num_beams=self.num_beams,
            max_grad_norm=self.max_grad_norm,
            lora=self.lora,
            dpo=self.dpo,
            trainer_args=self.trainer_args,
            seq2seq_args=self.seq2seq_args,
            eval_held_batches=self.eval_held_batches if self.evaluates else 0,
            compile=self.compile,
            padding_free=self.padding_free,
            trl_head=self.trl_head,
        )

    def describe(self) -> str:
        """One line for a study's summary."""
        lengths = f"length {self.max_length}" + (
            f" -> labels {self.max_target_length}" if self.max_target_length else ""
        )
        parts = [self.precision, lengths]
        if self.evaluates:
            gen = ""
            if self.generate:
                gen = f" + generate {self.generation_max_length or self.max_target_length or self.max_length} tokens"
                gen += f" x {self.num_beams} beams" if self.num_beams > 1 else ""
            parts.append(f"eval batch {self.eval_batch_size or '(train micro batch)'}{gen}")
        else:
            parts.append("no eval step")
        if self.lora is not None:
            parts.append(self.lora.describe())
        if self.dpo is not None:
            parts.append(self.dpo.describe())
        parts += trainer_parts(self.trainer_args)
        if self.padding_free is not None:
            parts.append("padding-free (each micro batch one row of micro x length tokens)")
        if self.compile:
            parts.append(f"torch.compile ({self.compile.get('backend')}; accelerate config: dynamo_config)")
        return ", ".join(parts)


@dataclass(frozen=True)
class JobFlags:
    """The job settings given on their own (the command line's --max-length ..., ``tune(max_length=...)``, an API
    body's ``max_length``): None = not given. Declared once here (tuner.declared): every face's options come from
    these fields."""

    max_length: int | None = setting("your job's input length in tokens (encoder / causal)", None, min=1, faces=_ALL)
    max_target_length: int | None = setting("your job's seq2seq label length", None, min=1, faces=_ALL)
    precision: Precision | None = setting("your job's precision: bf16, fp16 or fp32", None, cli_type=str, faces=_ALL)
    eval_batch_size: int | None = setting("your job's per-device eval batch", None, min=1, faces=_ALL)
    generate: bool | None = setting(
        "your job evaluates with predict_with_generate", None, flag="--generate/--no-generate", faces=_ALL
    )
    generation_max_length: int | None = setting("new tokens per eval generate", None, min=1, faces=_ALL)
    num_beams: int | None = setting("beams per eval generate", None, min=1, faces=_ALL)
    # LoRA: not in an API body (checking the adapters builds the model: a torch subprocess the API never starts)
    lora_r: int | None = setting(
        "a LoRA job: adapters of this rank train, the base is frozen (peft)", None, faces=_LOCAL
    )  # the other lora_* need it (tuner.job.lora)
    lora_alpha: int | None = setting("LoRA alpha (default 8)", None, faces=_LOCAL)
    lora_dropout: float | None = setting("LoRA dropout (default 0)", None, faces=_LOCAL)
    lora_target_modules: str | Sequence[str] | None = setting(
        "q_proj,v_proj (default: peft's for the model)", None, cli_type=str, faces=_LOCAL
    )  # "q_proj,v_proj" or a list; None: peft's default
    lora_bias: str | None = setting("LoRA bias: none, all, lora_only", None, faces=_LOCAL)


HF_EVAL_BATCH = 8  # TrainingArguments.per_device_eval_batch_size's default

# Built-in presets only: a tiny model random-initialised from a config has no data, so the tool picks its shapes.
BUILTIN_DEFAULTS: Mapping[str, Any] = {"precision": "fp32", "max_length": 128}

# Training-args keys of each job setting, first found wins (Seq2SeqTrainingArguments and common script arguments).
HF_MAX_LENGTH_KEYS: tuple[str, ...] = ("max_source_length", "max_seq_length", "max_length", "model_max_length")
_HF_KEYS: Mapping[str, tuple[str, ...]] = {
    "max_length": HF_MAX_LENGTH_KEYS,
    "max_target_length": ("max_target_length", "val_max_target_length"),
    "generation_max_length": ("generation_max_length",),
    "num_beams": ("generation_num_beams", "num_beams"),
    "max_grad_norm": ("max_grad_norm",),
}


def resolve_job(
    *,
    builtin: bool,
    baseline_knobs: Mapping[str, Any] | None = None,
    hf_args: Mapping[str, Any] | None = None,
    flags: JobFlags = JobFlags(),
    length_hint: str = "pass --max-length (the longest input your job trains on; --max-target-length for seq2seq "
    "labels), or training args with max_source_length / max_seq_length",
    option: Callable[[str], str] = str,
    trainer: tuple[dict[str, Any] | None, bool] | None = None,
    compile: dict[str, Any] | None = None,
) -> Job:
    """The job from its sources, later wins: built-in defaults (``builtin`` presets only), the baseline (its parsed
    knobs: precision, eval batch, predict_with_generate; its training args: lengths, generation), then ``flags``
    (the lora_* flags from there, over a TRL recipe's use_peft + lora_*: tuner.job.ledger.trl); ``trainer``: the
    baseline's (trainer_args, seq2seq_args), what the probe's TrainingArguments are built from. Without a length from
    any source: a ConfigError saying ``length_hint`` (how this caller's user gives one); a bad LoRA flag: one naming it
    as ``option`` spells it."""
    values: dict[str, Any] = dict(BUILTIN_DEFAULTS) if builtin else {}
    values.update(_from_baseline(baseline_knobs, hf_args, values.get("precision")))
    if trainer is not None:
        values["trainer_args"], values["seq2seq_args"] = trainer
    values["compile"] = compile
    values["padding_free"] = padding_free_of(hf_args)
    values["trl_head"] = trl_head_of(hf_args)
    values.update(_from_args(hf_args))
    values.update({k: v for k, v in vars(flags).items() if v is not None and k not in LORA_FLAGS})
    lora = {**recipe_lora(hf_args or {}), **{k: getattr(flags, k) for k in LORA_FLAGS if getattr(flags, k) is not None}}
    values["lora"] = lora_spec(*(lora.get(k) for k in LORA_FLAGS), option=option)
    values["dpo"] = _dpo(recipe_dpo(hf_args or {}), values["lora"])
    if values.get("max_length") is None:
        raise ConfigError(f"no sequence length for this model: {length_hint}")
    if values.get("precision") is None:
        values["precision"] = "fp32"  # a baseline or a flag says otherwise; fp32 is what torch runs by default
    if values.get("generate") and values.get("eval_batch_size") is None:
        values["eval_batch_size"] = HF_EVAL_BATCH  # the Trainer's per_device_eval_batch_size default
    try:
        return Job.model_validate(values)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(x) for x in first.get("loc", ()))
        named = f"{option(where)} {first.get('input')!r}: " if where else ""
        raise ConfigError(f"job settings: {named}{first['msg']}") from None


def _dpo(given: dict[str, Any] | None, lora: LoraSpec | None) -> dict[str, Any] | None:
    """A DPO recipe's job: its reference is the adapter-disabled model where the job is LoRA (a --lora-r flag over a
    recipe without use_peft too: DPOTrainer's policy is then a PEFT model), unless precomputed."""
    if given is None or lora is None or given["reference"] != "model":
        return given
    return {**given, "reference": "adapter"}


def _from_baseline(
    knobs: Mapping[str, Any] | None, hf_args: Mapping[str, Any] | None, precision: str | None
) -> dict[str, Any]:
    """The job's precision from the baseline's knobs, and with training args their evaluation (tuner.job.
    evaluation: a job with training args evaluates the way they say)."""
    if knobs is None:
        return {}
    values = {"precision": knobs.get("precision", precision)}
    if hf_args:
        values["eval_batch_size"] = knobs.get("eval_batch_size")
        values["generate"] = bool(knobs.get("generate"))
        values["eval_held_batches"] = held_eval_batches(hf_args)
    return values


def _from_args(hf_args: Mapping[str, Any] | None) -> dict[str, Any]:
    """The lengths and generation settings the training args give (their keys, then their generation_config)."""
    values = {}
    for name, keys in _HF_KEYS.items():
        found = next((hf_args[k] for k in keys if hf_args and hf_args.get(k) is not None), None)
        if found is None:
            found = _generation_config(hf_args, name)
        if found is not None:
            values[name] = found
    return values


def _generation_config(hf_args: Mapping[str, Any] | None, name: str) -> Any:
    """A generation setting from their ``generation_config`` (inline), as their Seq2SeqTrainer reads it where the
    training args' own generation_max_length / generation_num_beams say nothing."""
    config = (hf_args or {}).get("generation_config")
    if not isinstance(config, Mapping):
        return None
    key = {"generation_max_length": "max_new_tokens", "num_beams": "num_beams"}.get(name)
    return config.get(key) if key else None


#: the knobs that belong to the job, fixed to its values in the space unless a space file lists them
JOB_KNOBS = ("precision", "max_length", "eval_batch_size", "generate")


def fix_space(space: Space, job: Job, listed: Collection[str] = ()) -> tuple[Space, list[str]]:
    """The space with the job's knobs fixed to the job's values, and the job knobs a space file changes on purpose
    (``listed``: the knobs the file names, kept as the file says)."""
    fixed: dict[str, list[Any]] = {}
    changed: list[str] = []
    for name in JOB_KNOBS:
        value = getattr(job, name)
        if name in listed:
            if list(getattr(space, name)) != [value]:
                changed.append(name)
            continue
        fixed[name] = [value]
    return space.restrict(**fixed), changed


def hold_engine(space: Space, engine: str | None, listed: Collection[str] = ()) -> Space:
    """The space searching the engine of the user's files (``engine``: their baseline's; None: no files), unless a
    space file names engines (``listed``). FSDP2: its own knobs (resharding, parameter offload) searched where the
    space file does not name them; torch (plain DDP): no ZeRO stage."""
    if engine is None or "engine" in listed:
        return space
    held: dict[str, list[Any]] = {"engine": [engine]}
    if engine == "fsdp2":
        held.update({name: [False, True] for name in FSDP_KNOBS if name not in listed})
    if engine == "torch" and "zero_stage" not in listed:
        held["zero_stage"] = [0]
    return space.restrict(**held)
