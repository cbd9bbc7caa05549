"""An accelerate config's DeepSpeed plugin (``distributed_type: DEEPSPEED`` with a ``deepspeed_config`` block of
``zero_stage``, ``offload_*_device``, ``zero3_init_flag`` ... and no ``deepspeed_config_file``: how alignment-handbook's
and open-r1's recipes launch) read as accelerate turns it into a DeepSpeed config.

`accelerate launch` hands the block to the training process as ACCELERATE_* variables (``str(value).lower()``:
accelerate.utils.launch.prepare_deepspeed_cmd_env); their TrainingArguments build accelerate's own ``DeepSpeedPlugin``
from them and set its mixed precision (theirs, else the launcher's: ``set_mixed_precision``). Here the same plugin is
built from the same strings, without the environment (every field given, none read from os.environ) and without a
process group, and its ``deepspeed_config`` ("auto" values and all) is what the baseline reader takes as the user's
DeepSpeed JSON: trial 0 is their config, the Trainer fills its "auto" from their training args as it fills a JSON's.
Every key of the block goes through the ledger (tuner.job.ledger.accelerate.DEEPSPEED_PLUGIN_KEYS). accelerate (and
torch) are imported only when such a config is read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tuner.errors import BaselineError
from tuner.job.ledger.accelerate import DEEPSPEED_PLUGIN_KEYS, checked

WHERE = "accelerate config deepspeed_config."
# accelerate's default for a key the block leaves out (DeepSpeedPlugin.__post_init__ with no ACCELERATE_* variable)
_UNSET = {
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "zero_stage": "2",
    "offload_optimizer_device": "none",
    "offload_param_device": "none",
    "offload_optimizer_nvme_path": "none",
    "offload_param_nvme_path": "none",
    "zero3_save_16bit_model": "false",
}
# the precisions accelerate's mixed_precision names, as DeepSpeedPlugin.set_mixed_precision reads them
_PRECISIONS = ("no", "fp16", "bf16")


@dataclass(frozen=True)
class PluginImport:
    """What an accelerate config's DeepSpeed plugin gives the baseline: the DeepSpeed config accelerate builds, the
    world size (num_processes), and notes on how it was read."""

    ds: dict[str, Any] | None  # None: their training args' own DeepSpeed JSON runs
    world_size: int | None
    notes: list[str] = field(default_factory=list)


def config_world(study: int | None, config: int | None) -> int | None:
    """The world size: the study's, else the accelerate config's num_processes; both given, they must agree."""
    if study is not None and config is not None and study != config:
        raise BaselineError(
            f"the world size {study} contradicts your accelerate config's num_processes {config}; make them equal "
            "or leave the world size out"
        )
    return study or config


def is_deepspeed(accelerate: Mapping[str, Any] | None) -> bool:
    return accelerate is not None and accelerate.get("distributed_type") == "DEEPSPEED"


def _checked_block(block: Any) -> dict[str, str]:
    """The block's keys through the ledger; each value as the launcher passes it (``str(value).lower()``, a path
    as it is)."""
    if not isinstance(block, Mapping):
        raise BaselineError(f"{WHERE[:-1]} must be a mapping of DeepSpeed plugin keys, got {type(block).__name__}")
    checked(WHERE, block, DEEPSPEED_PLUGIN_KEYS)
    return {
        str(key): str(value) if str(key).endswith("nvme_path") else str(value).lower()
        for key, value in block.items()
        if value is not None
    }


def _number(key: str, text: str, kind: type) -> Any:
    try:
        return kind(text)
    except ValueError:
        raise BaselineError(f"{WHERE}{key}={text!r} must be a number or auto, as DeepSpeedPlugin reads it") from None


def _plugin_kwargs(given: Mapping[str, str]) -> dict[str, Any]:
    """DeepSpeedPlugin's keywords from the launcher's strings, converted as its __post_init__ converts them."""
    from accelerate.utils import str_to_bool

    env = {**_UNSET, **given}
    gas, clip = env["gradient_accumulation_steps"], env["gradient_clipping"]
    stage = _number("zero_stage", env["zero_stage"], int)
    if stage not in (0, 1, 2, 3):
        raise BaselineError(f"{WHERE}zero_stage={stage} must be 0, 1, 2 or 3")
    init = env.get("zero3_init_flag", str(stage == 3))
    try:
        init_flag = str_to_bool(init) == 1
    except ValueError:
        raise BaselineError(f"{WHERE}zero3_init_flag={init!r} must be true or false") from None
    if stage == 3 and not init_flag:
        raise BaselineError(
            f"{WHERE}zero3_init_flag=false under ZeRO-3: every rank then holds the whole model until "
            "deepspeed.initialize partitions it, and the probe builds it partitioned (deepspeed.zero.Init, as the "
            "Trainer does with a DeepSpeed JSON); set zero3_init_flag: true"
        )
    return {
        "hf_ds_config": "none",  # the plugin form: accelerate builds the DeepSpeed config
        "gradient_accumulation_steps": _number("gradient_accumulation_steps", gas, int) if gas != "auto" else gas,
        "gradient_clipping": _number("gradient_clipping", clip, float) if clip != "auto" else clip,
        "zero_stage": stage,
        "offload_optimizer_device": env["offload_optimizer_device"],
        "offload_param_device": env["offload_param_device"],
        "offload_optimizer_nvme_path": env["offload_optimizer_nvme_path"],
        "offload_param_nvme_path": env["offload_param_nvme_path"],
        "zero3_init_flag": init_flag and stage == 3,
        "zero3_save_16bit_model": env["zero3_save_16bit_model"] == "true",
    }


def mixed_precision(accelerate: Mapping[str, Any], training_args: Mapping[str, Any]) -> str:
    """The precision their TrainingArguments hand the plugin: their fp16 / bf16, else the launcher's mixed_precision
    (TrainingArguments.__post_init__ reads ACCELERATE_MIXED_PRECISION)."""
    if training_args.get("fp16"):
        return "fp16"
    if training_args.get("bf16"):
        return "bf16"
    launcher = str(accelerate.get("mixed_precision") or "no").lower()
    if launcher not in _PRECISIONS:
        raise BaselineError(
            f"accelerate config mixed_precision={launcher[:20]!r} under DeepSpeed: tuner probes no, fp16 or bf16; "
            "set one of them"
        )
    return launcher


def plugin_ds_config(block: Mapping[str, Any], precision: str) -> dict[str, Any]:
    """The DeepSpeed config accelerate's DeepSpeedPlugin builds from a ``deepspeed_config`` block (its launcher's
    strings) at ``precision`` ("no", "fp16", "bf16"), less ``steps_per_print`` (accelerate sets it at run time)."""
    from accelerate.utils.dataclasses import DeepSpeedPlugin

    kwargs = _plugin_kwargs(_checked_block(block))
    plugin = DeepSpeedPlugin(**kwargs)
    plugin.set_mixed_precision(precision)
    config = dict(plugin.deepspeed_config)
    config.pop("steps_per_print", None)
    return config


def plugin_import(
    accelerate: Mapping[str, Any], training_args: Mapping[str, Any], ds_config: Mapping[str, Any] | None
) -> PluginImport:
    """An accelerate DeepSpeed config beside the training args: the DeepSpeed config that runs (their training args'
    own ``deepspeed`` JSON when they name one: their TrainingArguments then build the plugin from it, and the
    launcher's block is not read)."""
    block = accelerate.get("deepspeed_config") or {}
    world = accelerate.get("num_processes")
    world_size = world if isinstance(world, int) and not isinstance(world, bool) and world >= 1 else None
    if ds_config is not None or training_args.get("deepspeed"):
        note = (
            "accelerate config deepspeed_config: not read (your training args' DeepSpeed JSON is what runs: their "
            "TrainingArguments build the plugin from it)"
        )
        _checked_block(block)
        return PluginImport(None, world_size, [note])
    precision = mixed_precision(accelerate, training_args)
    config = plugin_ds_config(block, precision)
    stage = config["zero_optimization"]["stage"]
    notes = [
        f"accelerate config deepspeed_config: read as accelerate's DeepSpeedPlugin builds it (ZeRO-{stage}, "
        f"mixed precision {precision}); its 'auto' values filled from the training args as the Trainer fills them"
    ]
    return PluginImport(config, world_size, notes)
