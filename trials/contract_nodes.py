"""The probe contract across nodes (issue 43): the knobs only a job across nodes tunes, and the checks of a config
that spans nodes. Part of the contract: trials.contract re-exports it (tuner/ imports it from there). No torch import.

The knobs, each read by one engine only: ZeRO++ of DeepSpeed ZeRO-3 (hpZ's secondary partition of the parameters over
a rank subgroup, ideally the GPUs of a node; int8 weights in the all-gather, int4 gradients in the reduce-scatter: CUDA
kernels only) and FSDP2's replicate degree (HSDP: accelerate's parallelism_config dp_replicate_size, the parameters
sharded over world / replicate ranks). A Knobs dump leaves each out at its default, so the keys of configs stored
before they existed do not change (as the FSDP knobs').
"""

from __future__ import annotations

from typing import Any

NODE_KNOBS: tuple[str, ...] = (
    "zero_hpz_partition_size",
    "zero_quantized_weights",
    "zero_quantized_gradients",
    "dp_replicate_size",
)
ZERO_PP_KNOBS: tuple[str, ...] = NODE_KNOBS[:3]
#: the knobs that split the world into groups: each must divide the world size
DIVIDING_KNOBS: tuple[str, ...] = ("zero_hpz_partition_size", "dp_replicate_size")


def _set(value: Any) -> bool:
    return value not in (None, False, 1) or value is True


def node_knobs_refusal(knobs: Any) -> str | None:
    """Why ``knobs`` (trials.contract.Knobs) cannot carry its across-node knobs, or None."""
    zero_pp = any(_set(getattr(knobs, name)) for name in ZERO_PP_KNOBS)
    if zero_pp and (knobs.engine != "deepspeed" or knobs.zero_stage != 3):
        return (
            "zero_hpz_partition_size, zero_quantized_weights and zero_quantized_gradients are ZeRO++ knobs of "
            "ZeRO-3; use engine 'deepspeed' with zero_stage 3"
        )
    if _set(knobs.dp_replicate_size) and knobs.engine != "fsdp2":
        return "dp_replicate_size (HSDP replicas) is an FSDP2 knob; use engine 'fsdp2'"
    return None


def drop_unset(data: dict[str, Any]) -> None:
    """A Knobs dump without its across-node knobs at their defaults."""
    for name in NODE_KNOBS:
        if data.get(name) in (None, False):
            data.pop(name, None)


def zero_pp_label(knobs: Any) -> str:
    """`` (hpZ 8, qwZ, qgZ)`` for a ZeRO-3 config with ZeRO++, else nothing."""
    plus = [f"hpZ {knobs.zero_hpz_partition_size}"] if (knobs.zero_hpz_partition_size or 1) > 1 else []
    plus += ["qwZ"] if knobs.zero_quantized_weights else []
    plus += ["qgZ"] if knobs.zero_quantized_gradients else []
    return f" ({', '.join(plus)})" if plus else ""


def layout_refusal(world_size: int, nnodes: int, knobs: Any) -> str | None:
    """Why a probe of ``world_size`` ranks on ``nnodes`` nodes cannot run ``knobs``, or None: the world is whole
    nodes, and each group size divides it."""
    if world_size % nnodes:
        return f"world size {world_size} is not {nnodes} nodes of equal ranks"
    for name in DIVIDING_KNOBS:
        value = getattr(knobs, name) or 1
        if world_size % value:
            return f"{name} {value} does not divide the world size {world_size}"
    return None


__all__ = ["NODE_KNOBS", "ZERO_PP_KNOBS", "drop_unset", "layout_refusal", "node_knobs_refusal", "zero_pp_label"]
