"""TRL recipes: the fields of TRL's SFTConfig / DPOConfig (beyond TrainingArguments') and its ModelConfig, as a probe
reads them, and what recognises a file as an SFT or a DPO recipe.

A recipe is what TRL's TrlParser reads into its config class plus ModelConfig (alignment-handbook, TRL's scripts). The
field lists are TRL 1.16.0's own (fields/trl-1.16.0.json, written by scripts/ledger_trl_fields.py from the release;
tests/tuner/job/test_ledger_trl.py checks them and that each field has a verdict here). "run" is only what tuner's
probe really runs today: SFT's ``max_length`` (the sequence length), ``packing`` (rows of max_length tokens:
tuner.job.packing; BFD, TRL 1.16's default strategy, and ``padding_free`` train padding-free: each micro batch one
flattened row, trials.data.flattened), ModelConfig's LoRA (``use_peft`` + ``lora_*``: tuner's LoRA job, trials.lora)
and fp32 weights; a DPO recipe's step (trials.dpo: the pairs as 2 x micro rows at ``max_length``, the frozen
reference model, or the PEFT adapter disabled, or ``precompute_ref_log_probs``); TRL's fused LM head for both where
TRL is installed beside tuner (tuner.job.trl_head: the dry run says which). What changes memory in a way the
probe does not run yet is refused in one line, and ``padding_free`` without packing and with a max_length, which TRL
raises on (``Recipe.entry``). SFTConfig's and DPOConfig's changed TrainingArguments defaults (gradient_checkpointing,
bf16, learning_rate, logging_steps) are applied as TRL applies them (``Recipe.defaults``). Pure: no trl import.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Literal

from tuner.errors import BaselineError
from tuner.job.ledger import Entry, falsy, neutral, run, unless
from tuner.job.packing import PADDING_FREE, UNPACKED_FIX, UNPACKED_PADDING_FREE, packing_line

TRL_RELEASE = "1.16.0"  # the TRL release whose fields the ledger holds
Kind = Literal["sft", "dpo"]

_NOT_RUN = "tuner's probe does not run TRL's {} yet, so it would measure a different step"
_DEFAULT_FIX = "set it to its default to search the step without it, knowing the probe then differs"
_RECIPE = "your recipe's data / tokenizer preparation (on the host, before the step)"
_LOSS = "a value of the loss over the same logits (not memory or speed)"
_ONLY = "applies only with {} (which is refused when set)"
_MASKED = (
    "labels -100 on the {} positions: the same input shapes; TRL 1.16's fused LM head, which the probe runs as TRL "
    "does (tuner.job.trl_head), scores only the labelled positions on a GPU (every position on a CPU)"
)
PackingStrategy = Literal["bfd", "bfd_split", "wrapped"]


@functools.cache
def trl_fields() -> dict[str, Any]:
    """The recorded field lists of TRL_RELEASE: SFTConfig / DPOConfig (beyond TrainingArguments'), ModelConfig, and
    the defaults each config changes."""
    text = resources.files("tuner.job.ledger").joinpath(f"fields/trl-{TRL_RELEASE}.json").read_text()
    return dict(json.loads(text))


def _off(why: str, what: str, fix: str = _DEFAULT_FIX) -> Entry:
    """Neutral at its default (off); refused when set."""
    return neutral(why, unless(falsy, _NOT_RUN.format(what)), fix)


def _model_init(value: Any) -> str | None:
    return None if falsy(value) else _NOT_RUN.format("model_init_kwargs (how the model loads: dtype, quantization)")


def _pad_multiple(value: Any) -> str | None:
    return None if value in (None, "auto", 1) else _NOT_RUN.format("padding to a multiple of pad_to_multiple_of")


def _dtype(value: Any) -> str | None:
    if value in (None, "float32"):
        return None
    return (
        f"tuner's probe does not load your weights in {value} yet (it builds them in fp32 and runs the precision "
        "under autocast, as the Trainer does), so it would measure a different step"
    )


_COMMON: dict[str, Entry] = {
    "model_init_kwargs": neutral(
        "how TRL loads the model", _model_init, "drop it (ModelConfig's dtype / attn_implementation say the same)"
    ),
    "trust_remote_code": neutral("your recipe's model loading (tuner asks `tuner --trust-remote-code`)"),
    "router_aux_loss_coef": neutral("a MoE router loss weight (a value)"),
    "dataset_num_proc": neutral(_RECIPE),
    "truncation_mode": neutral(_RECIPE + ": which end is cut at max_length"),
    "padding_free": _off("padding-free batches off: the probe's padded rows", "padding-free batches"),
    "pad_to_multiple_of": neutral(
        "the collator's padding multiple", _pad_multiple, "drop it (tuner pads as --padding says)"
    ),
    "activation_offloading": _off("activations stay on the device", "activation offloading to the host"),
    "pad_token": neutral("a deprecated tokenizer setting"),
}

SFT_FIELDS: dict[str, Entry] = {
    **_COMMON,
    "max_length": run("the sequence length (the probe pads to it; TRL truncates there)"),
    "chat_template_path": neutral(_RECIPE),
    "dataset_text_field": neutral(_RECIPE),
    "dataset_kwargs": neutral(_RECIPE),
    "eos_token": neutral(_RECIPE),
    "shuffle_dataset": neutral(_RECIPE),
    "packing": run(
        "packing: rows of up to max_length tokens, TRL filling each from the samples (wrapped: the sample stream cut; "
        "bfd / bfd_split, TRL's default: best-fit decreasing, trained padding-free); the worst batch is full rows; "
        "with --dataset the batches are the packed rows (tuner.job.packing)"
    ),
    "packing_strategy": run("how packing fills its rows (bfd, TRL's default, trains padding-free: " + PADDING_FREE),
    # padding_free without packing is refused by Recipe.entry, which sees packing
    "padding_free": run(PADDING_FREE),
    "eval_packing": run("packing of the eval data (None: as packing), run as packing is"),
    "completion_only_loss": neutral(_MASKED.format("prompt")),
    "assistant_only_loss": neutral(_MASKED.format("non-assistant")),
    "loss_type": neutral(
        "TRL 1.16's nll computes the loss through a fused LM head: a tile of min(tokens, 4096) x 32768 (forward, and "
        "again in the backward) in place of the full logits. The probe runs TRL's own head where TRL >= 1.16 is "
        "installed beside tuner, else the full logits (below your peak for a vocabulary under 32768), as the dry "
        "run says (tuner.job.trl_head)",
        unless(lambda v: v in ("nll", "chunked_nll"), _NOT_RUN.format("loss_type other than nll")),
        "set it nll to search the step without it, knowing the probe then differs",
    ),
}

DPO_FIELDS: dict[str, Entry] = {
    **_COMMON,
    "max_length": run("each pair's rows' length (prompt + completion; the probe pads them to it, TRL truncates there)"),
    "disable_dropout": neutral("dropout off in the policy and reference (values, not memory)"),
    "precompute_ref_log_probs": run(
        "the reference log-probs come with the data: no reference model nor its forward in the step (trials.dpo)"
    ),
    "precompute_ref_batch_size": neutral(
        "the batch of the no-grad reference pass TRL runs once before training (with precompute_ref_log_probs), "
        "not the step's"
    ),
    "loss_type": neutral(_LOSS),
    "loss_weights": neutral(_LOSS),
    "ld_alpha": neutral(_LOSS),
    "f_divergence_type": neutral(_LOSS),
    "f_alpha_divergence_coef": neutral(_LOSS),
    "label_smoothing": neutral(_LOSS),
    "beta": run("DPO's beta, the loss's temperature (the probe's loss runs it; a value, not memory)"),
    "use_weighting": neutral(_LOSS),
    "discopop_tau": neutral(_LOSS),
    "sync_ref_model": _off("the reference model stays frozen", "reference-model sync (TR-DPO)"),
    "ref_model_mixup_alpha": neutral(_ONLY.format("sync_ref_model")),
    "ref_model_sync_steps": neutral(_ONLY.format("sync_ref_model")),
}

_NO_PEFT = "applies only with use_peft (TRL builds no adapters without it)"

MODEL_FIELDS: dict[str, Entry] = {
    "model_name_or_path": run("the model probed where no --model is named; a --model must be it (check_model)"),
    "model_revision": neutral("which revision of the model is downloaded"),
    "dtype": run(
        "fp32 weights (ModelConfig's default), the precision run under autocast as the Trainer does",
        _dtype,
        "set dtype float32 (ModelConfig's default) to search with fp32 weights, knowing your run then differs",
    ),
    "attn_implementation": neutral(
        "the attention kernel",
        unless(lambda v: v in (None, "eager", "sdpa"), _NOT_RUN.format("this attention implementation")),
        "drop it (the probe runs the model's default, sdpa) knowing the probe then differs",
    ),
    "use_peft": run("LoRA adapters on a frozen base (tuner's LoRA job: lora_r, lora_alpha ...)"),
    "lora_r": run("the adapters' rank (with use_peft)"),
    "lora_alpha": run("the adapters' alpha (with use_peft)"),
    "lora_dropout": run("the adapters' dropout (with use_peft)"),
    "lora_target_modules": run(
        "the modules adapted (with use_peft)",
        unless(lambda v: v != "all-linear" and v != ["all-linear"], "peft's all-linear target is not probed yet"),
        "list the modules (e.g. q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj)",
    ),
    "lora_target_parameters": _off(_NO_PEFT, "LoRA on parameters (lora_target_parameters)"),
    "lora_modules_to_save": _off(_NO_PEFT, "fully trained modules beside the adapters (lora_modules_to_save)"),
    "lora_task_type": neutral("peft's task type (CAUSAL_LM: the same adapters)"),
    "use_rslora": neutral("rank-stabilised scaling of the adapters (a value)"),
    "use_dora": _off(_NO_PEFT, "DoRA adapters"),
    "load_in_8bit": _off("full-precision base weights", "8-bit base weights (bitsandbytes)"),
    "load_in_4bit": _off("full-precision base weights", "4-bit base weights (bitsandbytes)"),
    "bnb_4bit_quant_type": neutral(_ONLY.format("load_in_4bit")),
    "use_bnb_nested_quant": neutral(_ONLY.format("load_in_4bit")),
    "bnb_4bit_quant_storage": neutral(_ONLY.format("load_in_4bit")),
}


def only(kind: Kind) -> frozenset[str]:
    """The keys of one config class that the other lacks (what tells an SFT recipe from a DPO one)."""
    data = trl_fields()
    sft, dpo = set(data["SFTConfig"]), set(data["DPOConfig"])
    return frozenset(sft - dpo if kind == "sft" else dpo - sft)


def trl_keys() -> frozenset[str]:
    data = trl_fields()
    return frozenset(data["SFTConfig"]) | frozenset(data["DPOConfig"]) | frozenset(data["ModelConfig"])


@dataclass(frozen=True)
class Recipe:
    """What a training-args file is as TRL reads it: an SFT or DPO recipe (None: not a TRL recipe), why, and the
    TrainingArguments defaults its config class changes, resolved for the keys the file leaves out."""

    kind: Kind | None
    why: str = ""
    defaults: dict[str, Any] = field(default_factory=dict)
    peft: bool = False  # ModelConfig's use_peft: the lora_* build adapters
    packing: PackingStrategy | None = None  # SFT's packing_strategy when packing is set (None: not packed)
    strategy: PackingStrategy | None = None  # SFT's packing_strategy, set or TRL's default (None: not SFT)
    reference: str = ""  # a DPO recipe's reference: "model", "adapter" or "precomputed" (trials.contract.DpoSpec)
    padding_free: bool = False  # SFT's padding_free set (BFD packing trains padding-free without it)
    unbounded: bool = False  # SFT's max_length: null (the samples untruncated; padding_free without packing needs it)

    @property
    def config(self) -> str:
        return "SFTConfig" if self.kind == "sft" else "DPOConfig"

    def entry(self, key: str) -> Entry | None:
        """The TRL ledger's entry for ``key`` in this recipe (None: not a TRL field of it)."""
        if self.kind is None:
            return None
        table = SFT_FIELDS if self.kind == "sft" else DPO_FIELDS
        if key in trl_fields()[self.config]:
            if key == "padding_free" and self.kind == "sft" and self.packing is None and not self.unbounded:
                return run(table[key].why, unless(falsy, UNPACKED_PADDING_FREE), UNPACKED_FIX)
            return table[key]
        if key not in trl_fields()["ModelConfig"]:
            return None
        if key.startswith("lora_") and key in MODEL_FIELDS and not self.peft:
            return neutral(_NO_PEFT)
        return MODEL_FIELDS[key]

    def notes(self) -> list[str]:
        """How each changed default was applied, for the baseline's notes."""
        return [f"{k}: {v!r} (TRL {TRL_RELEASE} {self.config}'s default)" for k, v in self.defaults.items()]

    def line(self) -> str:
        """Where the recipe reading comes from, for the dry run."""
        if self.kind is None:
            return ""
        changed = ", ".join(f"{k} {_said(v)}" for k, v in self.defaults.items())
        applied = f"; TRL {TRL_RELEASE} {self.config}'s defaults: {changed}" if changed else ""
        packed = packing_line(self.packing, self.padding_free)
        reference = _REFERENCE.get(self.reference, "")
        return f"{'SFT' if self.kind == 'sft' else 'DPO'} recipe ({self.why}){applied}{packed}{reference}"


def _said(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _keys(found: set[str]) -> str:
    shown = sorted(found)
    return ", ".join(shown[:4]) + (" ..." if len(shown) > 4 else "")


def read_recipe(given: Mapping[str, Any], fields: frozenset[str] = frozenset()) -> Recipe:
    """``given`` as TRL reads it: an SFT recipe when it carries SFTConfig-only keys, a DPO recipe when DPOConfig-only
    ones, else a TRL recipe read as SFT when it carries a TRL key that is none of ``fields`` (TrainingArguments') nor
    a plain script argument (tuner.job.ledger.script_args); not a recipe otherwise. A file with both kinds' own keys:
    a ValueError saying so (the caller words it)."""
    from tuner.job.ledger.script_args import SCRIPT_ARGS

    keys = {str(k) for k in given}
    sft, dpo = keys & only("sft"), keys & only("dpo")
    if sft and dpo:
        raise ValueError(
            f"SFTConfig-only keys ({_keys(sft)}) and DPOConfig-only keys ({_keys(dpo)}) in one file: TRL reads a "
            "recipe into one config class; keep the keys of the trainer you run"
        )
    if sft or dpo:
        kind: Kind = "sft" if sft else "dpo"
        why = f"{'SFTConfig' if sft else 'DPOConfig'}-only keys: {_keys(sft or dpo)}"
    else:
        trl = (keys & trl_keys()) - fields - set(SCRIPT_ARGS)
        if not trl:
            return Recipe(None)
        kind, why = "sft", f"TRL keys {_keys(trl)} and no DPOConfig-only key: read as SFTConfig"
    packing, strategy = (packing_of(given), _strategy(given)) if kind == "sft" else (None, None)
    peft = bool(given.get("use_peft"))
    reference = _reference(given, peft) if kind == "dpo" else ""
    free = kind == "sft" and not falsy(given.get("padding_free"))
    unbounded = kind == "sft" and "max_length" in given and given["max_length"] is None
    return Recipe(kind, why, _defaults(kind, given), peft, packing, strategy, reference, free, unbounded)


def packing_of(given: Mapping[str, Any], key: str = "packing") -> PackingStrategy | None:
    """The packing strategy of an SFT recipe's train data (``key`` "eval_packing": its eval data's, None following
    packing), as SFTTrainer packs it; None: not packed."""
    on = given.get(key)
    if key == "eval_packing" and on is None:
        on = given.get("packing")
    return None if falsy(on) else _strategy(given)


def _strategy(given: Mapping[str, Any]) -> PackingStrategy:
    """An SFT recipe's packing_strategy (TRL's default where unset; an unknown one, which TRL refuses, read as bfd:
    refused with packing as bfd is)."""
    strategy = given.get("packing_strategy") or trl_fields()["SFTConfig_own_defaults"]["packing_strategy"]
    return "wrapped" if strategy == "wrapped" else "bfd_split" if strategy == "bfd_split" else "bfd"


_REFERENCE = {
    "model": "; reference: a frozen copy of the model (its parameters and a no-grad forward of the pairs)",
    "adapter": "; reference: the PEFT model with its adapter disabled (no second model)",
    "precomputed": "; reference: precompute_ref_log_probs (no reference forward in the step)",
}


def _reference(given: Mapping[str, Any], peft: bool) -> str:
    """Where DPOTrainer takes a DPO recipe's reference log-probs in the step (dpo_trainer.py 908-914, 1318-1347):
    the data's precomputed columns, else the PEFT policy with its adapter disabled, else a frozen reference model."""
    if given.get("precompute_ref_log_probs"):
        return "precomputed"
    return "adapter" if peft else "model"


def recipe_dpo(given: Mapping[str, Any]) -> dict[str, Any] | None:
    """The DPO job a DPO recipe gives (trials.contract.DpoSpec's fields: beta, reference); None for any other file."""
    try:
        recipe = read_recipe(given)
    except ValueError:
        return None
    if recipe.kind != "dpo":
        return None
    beta = given.get("beta")
    return {
        "beta": trl_fields()["DPOConfig_own_defaults"]["beta"] if beta is None else beta,
        "reference": recipe.reference,
    }


def _defaults(kind: Kind, given: Mapping[str, Any]) -> dict[str, Any]:
    """The TrainingArguments defaults ``kind``'s config changes, for the keys ``given`` leaves out, resolved as its
    __post_init__ resolves them (bf16 None: true where fp16 is not set)."""
    changed = trl_fields()["SFTConfig_defaults" if kind == "sft" else "DPOConfig_defaults"]
    out: dict[str, Any] = {}
    for key, value in changed.items():
        if given.get(key) is not None:
            continue
        if key == "bf16" and value is None:
            value = not bool(given.get("fp16"))
        if key == "gradient_checkpointing" and given.get("activation_checkpointing") is not None:
            continue
        out[key] = value
    return out


def recipe_lora(given: Mapping[str, Any]) -> dict[str, Any]:
    """The LoRA job a recipe's ModelConfig half gives (tuner.job.lora's flags: lora_r ...; empty without use_peft),
    with ModelConfig's defaults for the lora_* it leaves out, as TRL's get_peft_config builds it."""
    if not given.get("use_peft"):
        return {}
    defaults = trl_fields()["ModelConfig_defaults"]
    pick = {k: given.get(k, defaults.get(k)) for k in ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules")}
    return {k: v for k, v in pick.items() if v is not None}


def recipe_fields(given: Mapping[str, Any]) -> frozenset[str]:
    """The keys TRL's parser takes beside TrainingArguments' for the recipe ``given`` is (its config class's and
    ModelConfig's, and "TRL recipe", where a whole-recipe refusal is kept); none for a plain training-args file."""
    try:
        recipe = read_recipe(given)
    except ValueError:  # both kinds' keys: the refusal is kept under "TRL recipe"
        return trl_keys() | {"TRL recipe"}
    if recipe.kind is None:
        return frozenset()
    data = trl_fields()
    return frozenset(data[recipe.config]) | frozenset(data["ModelConfig"])


def check_model(given: Mapping[str, Any] | None, source: str, option: str = "--model") -> None:
    """A recipe's ModelConfig ``model_name_or_path`` must be the model tuner probes (``source``): a BaselineError
    (one line, the fix) where they differ. A plain training-args file's model_name_or_path is its script's own."""
    named = (given or {}).get("model_name_or_path")
    if not isinstance(named, str) or not named:
        return
    try:
        recipe = read_recipe(given or {})
    except ValueError:
        return  # refused as a whole before this
    if recipe.kind is None or named.rstrip("/") == source.rstrip("/"):
        return
    raise BaselineError(
        f"training args model_name_or_path {named!r}: your recipe trains it, but tuner would probe {source!r}; pass "
        f"{option} {named} (or {option} with the model your recipe trains)"
    )


def recipe_args(given: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The training args as a TRL recipe trains: with its config's default ``max_length`` (TRL truncates there) where
    the recipe sets none. What the job's lengths are read from; the user's file (the exports) stays as given."""
    if not given or "max_length" in given:
        return given
    try:
        recipe = read_recipe(given)
    except ValueError:
        return given
    if recipe.kind is None:
        return given
    return {**given, "max_length": trl_fields()[f"{recipe.config}_own_defaults"]["max_length"]}
