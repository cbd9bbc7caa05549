"""The user's FSDP2 setup as trial 0: an accelerate config with ``distributed_type: FSDP`` and an ``fsdp_config`` block,
or TrainingArguments with ``fsdp`` / ``fsdp_config``, read as the installed accelerate / transformers read them (their
defaults for what the file leaves out: tuner.interop.fsdp_names) onto the FSDP2 knobs and the settings a search holds
(trials.contract.FsdpSettings).

Every key is read or refused, never dropped: a key accelerate or the Trainer would ignore without a word (a typo,
FSDP1's ``sharding_strategy``, ``forward_prefetch``, which accelerate does not implement under FSDP2), a value FSDP2
refuses (an integer ``reshard_after_forward``, ``LOCAL_STATE_DICT``) and FSDP version 1 are each a BaselineError of one
line naming the key and the fix. FSDP1 keys FSDP2 merely no longer reads (``use_orig_params``, ``sync_module_states``,
``backward_prefetch``) are carried and noted. Pure: no torch import."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import ValidationError

from trials.contract import FsdpSettings
from tuner.errors import BaselineError
from tuner.interop.ds_json import MAX_INT, nearest
from tuner.interop.export.mapping import HF_CHECKPOINTING_KEYS
from tuner.interop.fsdp_names import (
    ACCELERATE_DEFAULTS,
    ACCELERATE_KNOWN,
    ACCELERATE_OBSOLETE,
    FSDP_KEYS,
    KEY,
    MIXED_PRECISION,
    REFUSED,
    REFUSED_WHEN_SET,
    STATE_DICT_TYPES,
    TRAINER_DEFAULTS,
    TRAINER_KNOWN,
    TRAINER_OBSOLETE,
    TRAINER_PREFIX,
    VERSION,
    WRAP_POLICIES,
    FsdpKey,
    unprefixed,
)

ACCELERATE = "accelerate config"
TRAINER = "training args"
NO_BATCH_IN_ACCELERATE = (
    f"an {ACCELERATE} holds no batch size; give your training args beside it (per_device_train_batch_size, "
    "gradient_accumulation_steps ...: `tuner search --baseline accelerate.yaml --training-args args.json`)"
)


@dataclass(frozen=True)
class FsdpImport:
    """What the user's file says about FSDP2: the tuned knobs' values, the held settings, and what else it fixes."""

    source: str  # ACCELERATE or TRAINER: the file whose FSDP settings the user's run uses
    knobs: dict[str, bool]  # reshard_after_forward, offload_params, gradient_checkpointing (FSDP's own)
    held: FsdpSettings
    precision: str | None = None  # the accelerate config's mixed_precision; None: the training args decide
    world_size: int | None = None  # the accelerate config's num_processes
    notes: list[str] = field(default_factory=list)


def _bool(where: str, value: Any) -> bool:
    """A boolean as accelerate's str_to_bool reads the launcher's strings: true / false (a YAML string too)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise BaselineError(f"{where} must be true or false, got {_shown(value)}")


def _reshard(where: str, value: Any) -> bool:
    if isinstance(value, int) and not isinstance(value, bool):
        raise BaselineError(
            f"{where}: {_shown(value)} is an integer (FSDP1's ShardingStrategy number); accelerate's FSDP2 plugin "
            "takes a bool: write true (FULL_SHARD: free gathered parameters after forward) or false (SHARD_GRAD_OP)"
        )
    if isinstance(value, str) and value.strip().lower() not in ("true", "false"):
        raise BaselineError(
            f"{where}: {_shown(value)} is FSDP1's sharding strategy; FSDP2 takes a bool: write true (FULL_SHARD) or "
            "false (SHARD_GRAD_OP)"
        )
    return _bool(where, value)


def _classes(where: str, value: Any, lists: bool) -> tuple[str, ...]:
    """Block class names: a comma-separated string (both files), or a list of them (training args only: accelerate's
    launcher passes a list on as its text, which names no class)."""
    items: list[Any] = [value] if isinstance(value, str) else list(value) if lists and isinstance(value, list) else []
    if not items or not all(isinstance(i, str) for i in items):
        spelled = "a comma-separated string or a list of class names" if lists else "a comma-separated string"
        raise BaselineError(f"{where} must be {spelled}, e.g. 'LlamaDecoderLayer', got {_shown(value)}")
    return tuple(name.strip() for item in items for name in item.split(",") if name.strip())


def _value(key: FsdpKey, where: str, value: Any, source: str) -> Any:
    """One setting's value as tuner holds it, checked as the installed accelerate / transformers check it."""
    if key.name == "reshard_after_forward":
        return _reshard(where, value)
    if key.name == "auto_wrap_policy":
        policy = value.upper() if isinstance(value, str) and source == ACCELERATE else value  # accelerate: any case
        if policy not in WRAP_POLICIES:
            raise BaselineError(f"{where} must be one of {', '.join(WRAP_POLICIES)}, got {_shown(value)}")
        return policy
    if key.name == "transformer_layer_cls_to_wrap":
        return _classes(where, value, lists=source == TRAINER)
    if key.name == "min_num_params":
        if isinstance(value, float) and value.is_integer() and value <= MAX_INT:
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_INT:
            said = _shown(value)
            raise BaselineError(f"{where} must be a whole number of parameters >= 0 (at most 2^53), got {said}")
        return value
    if key.name == "state_dict_type":
        kind = value.upper() if isinstance(value, str) else value
        if kind not in STATE_DICT_TYPES:
            raise BaselineError(
                f"{where} {_shown(value)}: FSDP2 saves {' or '.join(STATE_DICT_TYPES)} (accelerate refuses "
                "LOCAL_STATE_DICT under FSDP2); pick one"
            )
        return kind
    return _bool(where, value)


def _version(where: str, value: Any, missing: str) -> None:
    """Version 2, as an integer (or the text "2", which accelerate's launcher reads with int()); 2.9, 2.5 or b"2"
    are not read as 2 (accelerate's int("2.9") fails; issue 42 §6)."""
    if (isinstance(value, int) and not isinstance(value, bool) and value == 2) or (
        isinstance(value, str) and value.strip() == "2"
    ):
        return
    said = missing if value is None else _shown(value)
    raise BaselineError(
        f"{where} is {said}: tuner searches FSDP2 (fully_shard), not FSDP1; set it to 2 (`accelerate to-fsdp2 "
        "--config_file FILE --output_file NEW` converts an accelerate config)"
    )


def _settings(
    given: Mapping[str, Any], source: str, spell: Callable[[FsdpKey], str], defaults: Mapping[str, Any]
) -> tuple[dict[str, bool], FsdpSettings]:
    """The knobs and the held settings of an FSDP block (``given``: its keys as the file spells them)."""
    values: dict[str, Any] = {}
    for key in FSDP_KEYS:
        name = spell(key)
        values[key.name] = (
            _value(key, f"{source} fsdp_config.{name}", given[name], source) if name in given else defaults[key.name]
        )
    knobs = {k.name: bool(values.pop(k.name)) for k in FSDP_KEYS if k.tuned}
    # a setting the wrap policy does not read is held at its default: configs that run the same compare equal
    if values["auto_wrap_policy"] != "SIZE_BASED_WRAP":
        values["min_num_params"] = FsdpSettings.model_fields["min_num_params"].default
    if values["auto_wrap_policy"] != "TRANSFORMER_BASED_WRAP":
        values["transformer_layer_cls_to_wrap"] = ()
    try:
        held = FsdpSettings.model_validate(values)
    except ValidationError as err:  # unreachable: every value was checked above
        raise BaselineError(f"{source} fsdp_config: {err.errors()[0]['msg']}") from None
    return knobs, held


def _refused(source: str, key: str, value: Any) -> None:
    name = unprefixed(key)
    if name in REFUSED and (name not in REFUSED_WHEN_SET or value):
        raise BaselineError(f"{source} fsdp_config.{key}: {REFUSED[name]}")


def accelerate_fsdp(config: Mapping[str, Any]) -> FsdpImport:
    """An accelerate config's FSDP2 setup, as `accelerate launch --config_file` passes it to the training process."""
    kind = config.get("distributed_type")
    if kind != "FSDP":
        raise BaselineError(
            f"{ACCELERATE} has distributed_type {_shown(kind)}; tuner imports an accelerate config that shards with "
            "FSDP (distributed_type: FSDP) or DeepSpeed (DEEPSPEED); give your DeepSpeed JSON or training args as the "
            "baseline"
        )
    block = config.get("fsdp_config") or {}
    if not isinstance(block, Mapping):
        raise BaselineError(f"{ACCELERATE} fsdp_config must be a mapping of fsdp_* keys, got {type(block).__name__}")
    notes: list[str] = []
    for key, value in block.items():
        if not isinstance(key, str) or key not in ACCELERATE_KNOWN:
            shown = _shown(key)
            raise BaselineError(
                f"{ACCELERATE} fsdp_config.{shown} is not a key accelerate reads (its launcher ignores it without a "
                f"word){nearest(shown, ACCELERATE_KNOWN)}; fix its spelling or remove it"
            )
        _refused(ACCELERATE, key, value)
        if key in ACCELERATE_OBSOLETE:
            notes.append(f"{ACCELERATE} fsdp_config.{key}: FSDP1's, not read under FSDP2 (kept in your file)")
    _version(f"{ACCELERATE} fsdp_config.{VERSION.accelerate}", block.get(VERSION.accelerate), "missing (FSDP1)")
    knobs, held = _settings(block, ACCELERATE, lambda k: k.accelerate, ACCELERATE_DEFAULTS)
    sync = block.get("fsdp_sync_module_states")
    if held.cpu_ram_efficient_loading and sync is not None and not _bool(f"{ACCELERATE} fsdp_sync_module_states", sync):
        raise BaselineError(
            f"{ACCELERATE}: fsdp_cpu_ram_efficient_loading needs fsdp_sync_module_states true (accelerate launch "
            "refuses it false); set it true or remove it (FSDP2 does not read it)"
        )
    mixed = config.get("mixed_precision") or "no"
    if not isinstance(mixed, str) or mixed not in MIXED_PRECISION:  # a list is not looked up (issue 42 §4)
        raise BaselineError(
            f"{ACCELERATE} mixed_precision {_shown(mixed)}: tuner probes {', '.join(MIXED_PRECISION)}; pick one of them"
        )
    world = config.get("num_processes")
    if world is not None and (isinstance(world, bool) or not isinstance(world, int) or world == 0 or world < -1):
        raise BaselineError(f"{ACCELERATE} num_processes must be a whole number >= 1, got {_shown(world)}")
    return FsdpImport(
        ACCELERATE, knobs, held, MIXED_PRECISION[mixed], world if world and world > 0 else None, notes=notes
    )


_LEGACY_RESHARD = {"full_shard": True, "shard_grad_op": False}


def _legacy(fsdp: Any, config: dict[str, Any], notes: list[str]) -> None:
    """TrainingArguments' deprecated ``fsdp`` string / list, translated into ``config`` as transformers does under
    FSDP2 (``_apply_legacy_fsdp_to_config``): full_shard / shard_grad_op -> reshard_after_forward, offload ->
    cpu_offload, auto_wrap -> the default wrap; FSDP1-only strategies refused as transformers refuses them."""
    items = fsdp.split() if isinstance(fsdp, str) else list(fsdp)
    for item in items:
        if not isinstance(item, str):  # [["full_shard"]], [{"a": 1}]: not looked up (issue 42 §4)
            raise BaselineError(
                f"{TRAINER} fsdp={_shown(fsdp)}: each item is one of transformers' option strings (full_shard, "
                f"shard_grad_op, offload, auto_wrap), got {type(item).__name__}; or give fsdp=true with fsdp_config"
            )
        if item in _LEGACY_RESHARD:
            config.setdefault("reshard_after_forward", _LEGACY_RESHARD[item])
        elif item == "offload":
            config.setdefault("cpu_offload", True)
        elif item != "auto_wrap":
            raise BaselineError(
                f"{TRAINER} fsdp={_shown(fsdp)}: {_shown(item)} is not an FSDP2 option (transformers refuses it under "
                "FSDP2); use fsdp=true with fsdp_config reshard_after_forward / cpu_offload"
            )
    notes.append(
        f"{TRAINER} fsdp={_shown(fsdp)}: deprecated spelling, read as transformers reads it (exports write true)"
    )


def _enabled(fsdp: Any) -> bool:
    if fsdp is None or fsdp is False or fsdp == "" or fsdp == []:
        return False
    if fsdp is True or isinstance(fsdp, (str, list)):
        return True
    raise BaselineError(f"{TRAINER} fsdp must be true (or transformers' option string), got {_shown(fsdp)}")


def _folded(given: Mapping[Any, Any], notes: list[str]) -> dict[str, Any]:
    """The fsdp_config keys as TrainingArguments folds them (``_process_fsdp_args``: each fsdp_-prefixed key, in
    order, popped and set unprefixed, so it replaces the plain one wherever either stands; issue 42 §6); both
    spellings given is said."""
    config: dict[str, Any] = {}
    for key, value in given.items():
        if not isinstance(key, str):
            raise BaselineError(f"{TRAINER} fsdp_config key {_shown(key)} is not text; name the setting")
        config[key] = value
    for key in list(config):
        if key.startswith(TRAINER_PREFIX):
            plain = unprefixed(key)
            if plain in config and config[plain] != config[key]:
                notes.append(
                    f"{TRAINER} fsdp_config gives {key} {_shown(config[key])} and {plain} {_shown(config[plain])}: "
                    f"transformers keeps {key}'s, and so does tuner"
                )
            config[plain] = config.pop(key)
    return config


def _shown(value: Any, keep: int = 80) -> str:
    """``repr(value)``, cut: a 3 MB key is not a 3 MB line (issue 42 §9)."""
    text = repr(value)
    return text if len(text) <= keep else f"{text[:keep]}..."


def _release_runs_fsdp2(fsdp: Any, default_version: int) -> None:
    """transformers 4.x's Trainer hands FSDP to accelerate's plugin, whose default is FSDP1: refused in one line."""
    if default_version != 2:
        raise BaselineError(
            f"{TRAINER} fsdp={fsdp!r}: transformers 4.x's Trainer runs FSDP1 from its fsdp arguments (accelerate's "
            "default), and tuner searches FSDP2; launch with an accelerate config with fsdp_version: 2, or train on "
            "transformers >= 5 (pass --transformers-version)"
        )


def trainer_fsdp(args: Mapping[str, Any], default_version: int = 2) -> FsdpImport | None:
    """TrainingArguments' FSDP2 setup as ``_process_fsdp_args`` reads it; None when ``fsdp`` does not enable FSDP.
    ``default_version``: the FSDP version their release runs when fsdp_config names none (transformers 5: 2;
    4.x: 1, accelerate's plugin default, which tuner refuses in one line)."""
    fsdp = args.get("fsdp")
    if not _enabled(fsdp):
        return None
    given = args.get("fsdp_config") or {}
    if isinstance(given, str):
        raise BaselineError(
            f"{TRAINER} name fsdp_config={_shown(given)}; give the training-args file (its path is read next to it) or "
            "the fsdp_config object inline"
        )
    if not isinstance(given, Mapping):
        raise BaselineError(f"{TRAINER} fsdp_config must be an object, got {type(given).__name__}")
    notes: list[str] = []
    config = _folded(given, notes)
    if fsdp is not True:
        _legacy(fsdp, config, notes)
    for key, value in config.items():
        if key not in TRAINER_KNOWN:
            raise BaselineError(
                f"{TRAINER} fsdp_config.{key[:80]} is not a key transformers reads (the Trainer ignores it without a "
                f"word){nearest(key[:80], TRAINER_KNOWN)}; fix its spelling or remove it"
            )
        _refused(TRAINER, key, value)
        if key in TRAINER_OBSOLETE:
            notes.append(f"{TRAINER} fsdp_config.{key}: FSDP1's, not read under FSDP2 (kept in your file)")
    if config.get("xla"):
        raise BaselineError(f"{TRAINER} fsdp_config.xla: XLA's FSDP is not FSDP2, which tuner searches; remove it")
    _release_runs_fsdp2(fsdp, default_version)
    _version(f"{TRAINER} fsdp_config.version", config.get("version", 2), "missing")
    knobs, held = _settings(config, TRAINER, lambda k: k.trainer, TRAINER_DEFAULTS)
    return FsdpImport(TRAINER, knobs, held, notes=notes)


def _checkpointing(args: Mapping[str, Any], found: FsdpImport) -> FsdpImport:
    """The training arguments' own checkpointing beside FSDP: both on is what the Trainer refuses; alone, it is
    probed as FSDP's activation checkpointing (what transformers recommends under FSDP), which the exports write."""
    top = next((args[k] for k in HF_CHECKPOINTING_KEYS if args.get(k) is not None), False)
    if not _bool(f"{TRAINER} activation_checkpointing", top):
        return found
    key = KEY["gradient_checkpointing"]
    fsdp_key = f"{found.source} fsdp_config.{key.trainer if found.source == TRAINER else key.accelerate}"
    if found.knobs["gradient_checkpointing"]:
        raise BaselineError(
            f"{TRAINER} activation_checkpointing and {fsdp_key} are both true, which the Trainer refuses; keep "
            "FSDP's and set the training argument false"
        )
    note = (
        f"{TRAINER} activation_checkpointing under FSDP: probed as FSDP's own ({fsdp_key}, as transformers "
        "recommends; the exports move it there)"
    )
    return replace(found, knobs={**found.knobs, "gradient_checkpointing": True}, notes=[*found.notes, note])


def fsdp_import(
    accelerate: Mapping[str, Any] | None,
    training_args: Mapping[str, Any] | None,
    deepspeed: bool,
    default_version: int = 2,
) -> FsdpImport | None:
    """The FSDP2 setup of the user's files (None: they configure no FSDP). With both files configuring FSDP, the
    training args' is what runs (the Trainer hands accelerate its own plugin; the launcher's FSDP_* are not read);
    ``deepspeed``: the files configure DeepSpeed too, which no launcher runs beside FSDP."""
    if accelerate is not None and training_args is None:
        raise BaselineError(NO_BATCH_IN_ACCELERATE)
    from_args = trainer_fsdp(training_args, default_version) if training_args is not None else None
    from_config = accelerate_fsdp(accelerate) if accelerate is not None else None
    found = from_args or from_config
    if found is not None and training_args is not None:
        found = _checkpointing(training_args, found)
        from_args = found if from_args is not None else None
    if found is not None and deepspeed:
        raise BaselineError(
            f"your {found.source} configure FSDP and your files DeepSpeed too, which no run does at once; give the "
            "files of the one setup you run"
        )
    if from_args is not None and from_config is not None:
        notes = [
            *from_config.notes,
            *from_args.notes,
            f"{TRAINER} fsdp_config: what runs (the Trainer passes its own FSDP plugin; the {ACCELERATE}'s "
            "fsdp_config is not read)",
        ]
        world = from_config.world_size
        return FsdpImport(TRAINER, from_args.knobs, from_args.held, from_config.precision, world, notes)
    return found
