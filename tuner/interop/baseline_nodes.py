"""What the user's accelerate config says about nodes (pure): the machines it runs on, which a search must probe
across (``num_machines`` = ``--nnodes``), and its FSDP2 replicate degree (``parallelism_config``: HSDP), which trial 0
runs as given."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from trials.contract import Knobs
from tuner.errors import BaselineError

ACCELERATE = "accelerate config"


def _whole(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BaselineError(f"{ACCELERATE} {name} must be a whole number >= 1, got {value!r}")
    return value


def check_machines(accelerate: Mapping[str, Any] | None, nnodes: int, option: Callable[[str], str] = str) -> None:
    """The user's accelerate config runs on ``num_machines`` > 1: a search of it probes across as many nodes (one line
    naming the fix otherwise: a one-node probe of a two-machine job measures another job). A one-machine config may
    be searched across nodes on purpose (its export then names them)."""
    if not accelerate:
        return
    machines = _whole("num_machines", accelerate.get("num_machines", 1) or 1)
    if machines > 1 and machines != nnodes:
        raise BaselineError(
            f"{ACCELERATE} runs on num_machines {machines}; probe it across as many nodes: {option('nnodes')} "
            f"{machines} {option('nproc_per_node')} G on every node (or srun -N {machines} --ntasks-per-node 1 "
            "tuner search ...)"
        )


def replicate_of(accelerate: Mapping[str, Any] | None) -> int | None:
    """The FSDP2 replicate degree (HSDP) of the user's accelerate config's ``parallelism_config``, None without one."""
    block = (accelerate or {}).get("parallelism_config") or {}
    if not isinstance(block, Mapping):
        raise BaselineError(f"{ACCELERATE} parallelism_config must be a mapping, got {type(block).__name__}")
    value = block.get("parallelism_config_dp_replicate_size")
    return _whole("parallelism_config_dp_replicate_size", value) if value is not None else None


def with_replicas(baseline: Knobs | None, accelerate: Mapping[str, Any] | None, world_size: int) -> Knobs | None:
    """Trial 0 with the replicate degree the user's accelerate config runs FSDP2 with (it must divide the world)."""
    replicas = replicate_of(accelerate)
    if baseline is None or baseline.engine != "fsdp2" or not replicas or replicas == 1:
        return baseline
    if world_size % replicas:
        raise BaselineError(
            f"{ACCELERATE} parallelism_config_dp_replicate_size {replicas} does not divide the world size "
            f"{world_size}; give replicas x shards = the ranks of every node"
        )
    return baseline.model_copy(update={"dp_replicate_size": replicas})


__all__ = ["check_machines", "replicate_of", "with_replicas"]
