"""The recipe export: a study whose baseline was a TRL recipe (tuner.job.ledger.trl: SFTConfig / DPOConfig keys plus
ModelConfig's) gets its recipe back with the tuned fields changed.

It is the hf export of their training args (tuner.interop.export.own: micro batch, accumulation, checkpointing, the
eval batch, precision, ``deepspeed`` / ``fsdp`` for the engine picked) laid out as their file was: every key they
wrote in their order (checkpointing under the name they used), the keys the export adds after them, YAML where their
recipe was YAML (TRL's ``TrlParser`` reads either). A study without a recipe baseline is a ConfigError saying so.
Pure functions.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import yaml

from tuner.errors import ConfigError
from tuner.interop.export.own import UserFiles
from tuner.job.ledger.trl import read_recipe

CHECKPOINTING = ("gradient_checkpointing", "activation_checkpointing")
NO_RECIPE = (
    "--format recipe writes back a TRL recipe (a YAML / JSON of SFTConfig + ModelConfig keys), and this study's "
    "baseline {}; use --format hf for TrainingArguments"
)


def recipe_files(files: UserFiles | None) -> UserFiles:
    """``files`` when their training args are a TRL recipe, else a ConfigError naming what the baseline was."""
    if files is None:
        raise ConfigError(NO_RECIPE.format("is not a file of yours (a study without --baseline)"))
    if files.training_args is None:
        raise ConfigError(NO_RECIPE.format("has no training-args file"))
    try:
        kind = read_recipe(files.training_args).kind
    except ValueError:
        kind = None
    if kind is None:
        raise ConfigError(NO_RECIPE.format("is plain training args (no SFTConfig / DPOConfig / ModelConfig key)"))
    return files


def to_recipe(given: Mapping[str, Any], exported: Mapping[str, Any]) -> dict[str, Any]:
    """``exported`` (the hf export of their ``given`` recipe) in their file's layout: their keys in their order, the
    checkpointing value under the name they wrote (transformers takes either; TRL's configs default it to true, so
    it is written even where they left it out), what the export adds after them."""
    out = dict(exported)
    theirs = next((name for name in CHECKPOINTING if name in given), None)
    ours = next((name for name in CHECKPOINTING if name in out), None)
    if theirs is not None and ours is not None and theirs != ours:
        out[theirs] = out.pop(ours)
    ordered = {key: out[key] for key in given if key in out}
    return ordered | {key: value for key, value in out.items() if key not in ordered}


def render_recipe(recipe: Mapping[str, Any], yaml_file: bool) -> str:
    """The recipe as text: YAML (their order kept) for a YAML recipe, else JSON."""
    if not yaml_file:
        return json.dumps(dict(recipe), indent=2) + "\n"
    header = "# your TRL recipe with the tuned fields changed (written by `tuner export --format recipe`)\n"
    return header + yaml.safe_dump(dict(recipe), sort_keys=False)
