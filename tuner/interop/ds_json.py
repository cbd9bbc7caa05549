"""The user's DeepSpeed JSON as DeepSpeed reads it: a knob's value at its path (tuner.interop.export.mapping.DS_PATH),
the checks DeepSpeed would fail (or a typo would silently pass), and the batch fields by DeepSpeed's own rule. Every
problem is a BaselineError naming the field. Pure code: no torch import."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from tuner.errors import BaselineError
from tuner.interop.ds_names import check_params, check_types
from tuner.interop.export.mapping import AUTO, DS_KNOWN_TOP, DS_PATH, PRECISION_BLOCKS, ZERO_KEYS, get_path

ZERO_BLOCK = DS_PATH["zero_stage"][0]  # "zero_optimization": where every ZeRO knob lives


def dotted(knob: str) -> str:
    return ".".join(DS_PATH[knob])


def ds_value(ds: Mapping[str, Any], knob: str, default: Any = None) -> Any:
    """The value at ``knob``'s DeepSpeed path (tuner.interop.export.mapping.DS_PATH), ``default`` when it is absent."""
    *parents, leaf = DS_PATH[knob]
    block = get_path(ds, parents)
    return block.get(leaf, default) if isinstance(block, Mapping) else default


def nearest(key: str, known: set[str] | frozenset[str]) -> str:
    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""


#: an integer setting at most (2^53: the largest a JSON reader holds exactly); 1e308 buckets were stored (issue 42 §10)
MAX_INT = 1 << 53


def as_int(where: str, value: Any, minimum: int = 1, maximum: int = MAX_INT) -> int:
    if isinstance(value, float) and value.is_integer() and abs(value) <= maximum:
        value = int(value)  # 2e8 in a JSON file is a float
    if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= maximum:
        shown = repr(value) if len(repr(value)) <= 80 else f"{repr(value)[:80]}..."
        raise BaselineError(f"{where} must be an integer >= {minimum} (at most {maximum:,}), got {shown}")
    return value


def as_bool(where: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise BaselineError(f"{where} must be true or false, got {value!r}")
    return value


def check_ds_keys(ds: Mapping[str, Any]) -> None:
    """Refuses a DeepSpeed JSON that DeepSpeed would refuse, or that a typo would silently change."""
    for key in ds:
        if key not in DS_KNOWN_TOP and nearest(key, DS_KNOWN_TOP):
            raise BaselineError(f"unknown DeepSpeed key {key!r}{nearest(key, DS_KNOWN_TOP)}")
    zero = ds.get(ZERO_BLOCK, {})
    if not isinstance(zero, dict):
        raise BaselineError(f"{ZERO_BLOCK} must be an object, got {zero!r}")
    for key in zero:
        if key not in ZERO_KEYS:
            raise BaselineError(f"unknown key {ZERO_BLOCK}.{key}{nearest(key, ZERO_KEYS)}; DeepSpeed rejects it too")
    stage = ds_value(ds, "zero_stage", 0)
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        raise BaselineError(f"{dotted('zero_stage')} must be 0, 1, 2 or 3, got {stage!r}")
    _check_offload(zero)
    check_types(ds)
    check_params(ds)
    for block in (*PRECISION_BLOCKS.values(), "bfloat16"):
        value = ds.get(block)
        if value is not None and not (isinstance(value, dict) and value.get("enabled", False) in (True, False, AUTO)):
            raise BaselineError(f'{block} must be an object like {{"enabled": true}}, got {value!r}')


def _check_offload(zero: Mapping[str, Any]) -> None:
    """Optimizer and (ZeRO-3) parameter offload to the CPU are knobs; to NVMe they are not probed."""
    for name in ("offload_optimizer", "offload_param"):
        block = zero.get(name)
        if block is not None and (
            not isinstance(block, dict) or block.get("device", "none") not in ("none", "cpu", "nvme")
        ):
            raise BaselineError(f"{ZERO_BLOCK}.{name} must be an object with device none, cpu or nvme")
    for name in ("offload_optimizer", "offload_param"):
        if get_path(zero, (name, "device")) == "nvme":
            raise BaselineError(
                f"{ZERO_BLOCK}.{name}.device 'nvme' is not a knob the tuner probes; use 'cpu' or 'none' in the baseline"
            )


def batch_fields(ds: Mapping[str, Any], world_size: int | None) -> tuple[int, int, int | None, int | None]:
    """(micro, accumulation, world, global) by DeepSpeed's own rules for the batch fields it was given."""
    tbs, micro, accum = (
        ds.get(k) for k in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
    )
    tbs = None if tbs in (None, AUTO) else as_int("train_batch_size", tbs)
    micro = None if micro is None else as_int("train_micro_batch_size_per_gpu", micro)
    accum = None if accum is None else as_int("gradient_accumulation_steps", accum)
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


__all__ = ["ZERO_BLOCK", "as_bool", "as_int", "batch_fields", "check_ds_keys", "dotted", "ds_value", "nearest"]
