"""Knobs of an FSDP2 config + the user's held FSDP2 settings -> accelerate's ``fsdp_config``, TrainingArguments'
``fsdp`` / ``fsdp_config``, and the ``FSDP_*`` environment `accelerate launch` derives from an accelerate config.

Every tuned key is written explicitly (``fsdp_version: 2``, reshard_after_forward, parameter offload, activation
checkpointing: older transformers defaulted reshard_after_forward to false and accelerate's launcher defaults the
version to 1), and so is every held setting that has a value (wrap policy, block classes, the size threshold of a
size-based wrap, state-dict type, CPU-RAM-efficient loading): the file says what the probes ran, whatever defaults the
user's release has. A user's own block (``given``) keeps every other key as they wrote it. Spellings come from
tuner.interop.fsdp_names, the table the baseline import reads with. Pure functions."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trials.contract import FsdpSettings, Knobs
from tuner.interop.fsdp_names import FSDP_KEYS, TRAINER_PREFIX, USE_FSDP_ENV, VERSION, FsdpKey

FSDP_VERSION = 2
# the one line every face says when a DeepSpeed JSON is asked of an FSDP2 pick
NO_DEEPSPEED_JSON = (
    "the pick runs engine fsdp2 (PyTorch FSDP2 through accelerate), which has no DeepSpeed JSON; export --format "
    "accelerate (an accelerate config with fsdp_config), hf (TrainingArguments fsdp / fsdp_config) or env"
)


def held(fsdp: FsdpSettings | Mapping[str, Any] | None) -> FsdpSettings:
    """The user's held FSDP2 settings (a study stores them as JSON); accelerate's defaults when they gave none."""
    if isinstance(fsdp, FsdpSettings):
        return fsdp
    return FsdpSettings.model_validate(dict(fsdp)) if fsdp else FsdpSettings()


def values(knobs: Knobs, settings: FsdpSettings) -> dict[str, Any]:
    """Each FSDP2 setting's value as the probes ran it; None for one that does not apply (no block classes named:
    the model's ``_no_split_modules``; the size threshold outside a size-based wrap), which is then left as given."""
    out: dict[str, Any] = {}
    for key in FSDP_KEYS:
        value = getattr(knobs if key.tuned else settings, key.name)
        if key.name == "transformer_layer_cls_to_wrap" and not value:
            value = None
        if key.name == "min_num_params" and settings.auto_wrap_policy != "SIZE_BASED_WRAP":
            value = None
        out[key.name] = value
    return out


def accelerate_block(knobs: Knobs, settings: FsdpSettings, given: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """accelerate's ``fsdp_config`` for the config: the user's block with the FSDP2 keys set (block classes as the
    comma-separated string the launcher passes on)."""
    out = dict(given or {})
    out[VERSION.accelerate] = FSDP_VERSION
    for key, value in zip(FSDP_KEYS, values(knobs, settings).values(), strict=True):
        if value is not None:
            out[key.accelerate] = ",".join(value) if isinstance(value, tuple) else value
    return out


def _trainer_spelling(key: FsdpKey, given: Mapping[str, Any]) -> str:
    """The user's own spelling of a TrainingArguments fsdp_config key (transformers strips a ``fsdp_`` prefix)."""
    prefixed = TRAINER_PREFIX + key.trainer
    return prefixed if prefixed in given and key.trainer not in given else key.trainer


def trainer_block(knobs: Knobs, settings: FsdpSettings, given: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """TrainingArguments' ``fsdp_config`` for the config: the user's block with the FSDP2 keys set, each under the
    spelling they used."""
    out = dict(given or {})
    found = {VERSION.name: FSDP_VERSION, **values(knobs, settings)}
    for key in (VERSION, *FSDP_KEYS):
        value = found[key.name]
        if value is not None:
            out[_trainer_spelling(key, out)] = list(value) if isinstance(value, tuple) else value
    return out


def fsdp_env(knobs: Knobs, settings: FsdpSettings) -> dict[str, str]:
    """The variables `accelerate launch` sets for this config's fsdp_config: with them, ``Accelerator()`` in a script
    started by torchrun builds the same FSDP2 plugin (FullyShardedDataParallelPlugin reads them)."""
    env = {USE_FSDP_ENV: "true", VERSION.env: str(FSDP_VERSION)}
    for key, value in zip(FSDP_KEYS, values(knobs, settings).values(), strict=True):
        if value is not None:
            env[key.env] = _text(value)
    return env


def _text(value: Any) -> str:
    """A value as the launcher writes it into the environment (booleans lower-case, class names comma-separated)."""
    if isinstance(value, tuple):
        return ",".join(value)
    return str(value).lower() if isinstance(value, bool) else str(value)
