"""A training-args file read through the ledger: each key run, neutral or refused, as the user's release has it.

``read_training_args`` raises a BaselineError (one line: the key, why, the fix) for a refused key or value and for a
key their release's TrainingArguments does not have (their Trainer raises on it too), naming the releases that have
it. What it returns says which keys the probe runs (``HeldArgs.trainer``: what the probe's own TrainingArguments are
built from) and which it keeps without running (``neutral``: the exports carry them, `--changes` names them). Pure.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tuner.errors import BaselineError
from tuner.job.ledger import NEUTRAL, RUN, Entry
from tuner.job.ledger.releases import ReleaseFields, release_fields, releases_with
from tuner.job.ledger.script_args import SCRIPT_ARGS
from tuner.job.ledger.training_args import TRAINING_ARGS
from tuner.job.ledger.trl import Recipe, read_recipe

#: the Seq2SeqTrainingArguments-only fields: a file with one of them is read as Seq2SeqTrainingArguments
SEQ2SEQ_FIELDS = frozenset(
    {"sortish_sampler", "predict_with_generate", "generation_max_length", "generation_num_beams", "generation_config"}
)
#: fields the probe sets itself (from the knobs, the engines and its own host): never passed to its TrainingArguments
PROBE_SET = frozenset(
    {
        "per_device_train_batch_size",
        "per_device_eval_batch_size",
        "gradient_accumulation_steps",
        "gradient_checkpointing",
        "activation_checkpointing",
        "bf16",
        "fp16",
        "deepspeed",
        "fsdp",
        "fsdp_config",
        "fsdp_min_num_params",
        "fsdp_transformer_layer_cls_to_wrap",
        "output_dir",
        "logging_dir",
        "overwrite_output_dir",
        "report_to",
        "push_to_hub",
        "hub_token",
        "push_to_hub_token",
        "resume_from_checkpoint",
        "local_rank",
        "use_cpu",
        "no_cuda",
    }
)
MAX_ECHO = 80  # characters of a user's key or value in a message


@dataclass(frozen=True)
class HeldArgs:
    """The user's training args as the ledger reads them for their release."""

    release: ReleaseFields
    seq2seq: bool  # Seq2SeqTrainingArguments (a Seq2Seq-only field is set)
    trainer: dict[str, Any] = field(default_factory=dict)  # what the probe's TrainingArguments are built from
    run: tuple[str, ...] = ()  # every key the probe runs (the knobs' too)
    neutral: dict[str, str] = field(default_factory=dict)  # key -> why it changes neither memory nor speed
    script: tuple[str, ...] = ()  # their script's own keys (not TrainingArguments')
    refused: dict[str, str] = field(default_factory=dict)  # not strict (doctor): key -> the refusal's line
    # a TRL recipe (tuner.job.ledger.trl): SFT or DPO, and TRL's changed defaults
    recipe: Recipe = field(default_factory=lambda: Recipe(None))

    def lines(self) -> list[str]:
        """What the dry run says of their file beyond the job line: the keys kept without a probe, in one line."""
        if not self.neutral:
            return []
        keys = ", ".join(sorted(self.neutral))
        return [f"kept, not probed (they change neither memory nor speed): {keys}"]


def _cut(text: Any) -> str:
    said = repr(text) if not isinstance(text, str) else text
    return said if len(said) <= MAX_ECHO else said[: MAX_ECHO - 1] + "…"


def _entry(key: str, fields: ReleaseFields, seq2seq: bool, recipe: Recipe) -> Entry:
    """The ledger's entry for ``key`` in a file of ``fields``' release (a BaselineError for a key it lacks)."""
    if fields.has(key, seq2seq=True):
        entry = TRAINING_ARGS.get(key)
        if entry is None:  # a field of a supported release the ledger misses: tests/tuner/job/test_ledger.py fails
            raise BaselineError(f"training args {_cut(key)}: tuner has no verdict for this field of {fields.named}")
        return entry
    trl = recipe.entry(key)
    if trl is not None:
        return trl
    if key in SCRIPT_ARGS:
        return SCRIPT_ARGS[key]
    others = [r for r in releases_with(key) if r != fields.release]
    if others:
        raise BaselineError(
            f"training args {_cut(key)}: not a field of {fields.named}'s TrainingArguments (it is one of "
            f"{', '.join(others)}'s); your Trainer raises on it: pass --transformers-version with the release you "
            f"train on, or drop it"
        )
    close = difflib.get_close_matches(key, sorted(fields.training_args | fields.seq2seq | set(SCRIPT_ARGS)), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise BaselineError(
        f"training args {_cut(key)}: not a field of {fields.named}'s TrainingArguments nor a script argument tuner "
        f"knows{hint}; your Trainer raises on it: fix or drop it"
    )


def _refusal(
    key: str, value: Any, fields: ReleaseFields, seq2seq: bool, recipe: Recipe
) -> tuple[Entry | None, str | None]:
    """The key's entry and, when the key or its value is refused, the one line saying so."""
    try:
        entry = _entry(key, fields, seq2seq, recipe)
    except BaselineError as err:
        return None, str(err)
    why = entry.refusal(value)
    if why is None:
        return entry, None
    fix = f": {entry.fix}" if entry.fix else ""
    return entry, f"training args {_cut(key)}={_cut(value)}: {why}{fix}"


def read_training_args(
    given: Mapping[str, Any], transformers_version: str | None = None, strict: bool = True
) -> HeldArgs:
    """Every key of ``given`` (a training-args JSON) through the ledger for ``transformers_version`` (None: this
    host's); a BaselineError for the first refused key or value (``strict=False``, as `tuner doctor` reads: each
    refusal kept in ``HeldArgs.refused`` and the key left out)."""
    fields = release_fields(transformers_version)
    seq2seq = any(k in SEQ2SEQ_FIELDS for k in given)
    run: list[str] = []
    neutral: dict[str, str] = {}
    script: list[str] = []
    trainer: dict[str, Any] = {}
    refused: dict[str, str] = {}
    recipe = _recipe(given, fields, strict, refused)
    for key, value in given.items():
        entry, line = _refusal(str(key), value, fields, seq2seq, recipe)
        if line is not None or entry is None:
            if strict:
                raise BaselineError(line or f"training args {_cut(key)}: refused")
            refused[str(key)] = line or "refused"
            continue
        is_field = fields.has(key)
        if not is_field:
            script.append(key)
        if entry.verdict == RUN:
            run.append(key)
        elif entry.verdict == NEUTRAL:
            neutral[key] = entry.why
        if is_field and key not in PROBE_SET:
            trainer[key] = value
    trainer.update({k: v for k, v in recipe.defaults.items() if k not in PROBE_SET and k not in trainer})
    return HeldArgs(fields, seq2seq, trainer, tuple(run), neutral, tuple(script), refused, recipe)


def _recipe(given: Mapping[str, Any], fields: ReleaseFields, strict: bool, refused: dict[str, str]) -> Recipe:
    """What TRL reads ``given`` as (tuner.job.ledger.trl): one mixing both kinds' keys is refused (kept in ``refused``
    under "TRL recipe" when not ``strict``)."""
    try:
        return read_recipe(given, fields.training_args | fields.seq2seq)
    except ValueError as err:
        line = f"training args: {err}"
    if strict:
        raise BaselineError(line)
    refused["TRL recipe"] = line
    return Recipe(None)
