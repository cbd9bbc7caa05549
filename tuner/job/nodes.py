"""The layout of a search across nodes (pure): how many nodes, how many ranks on each, from the options, Slurm's step
and the world size; what such a search needs of its storage.

One tuner worker runs on each node (the same `tuner search ... --nnodes N --nproc-per-node G` on every node, or
``srun -N N --ntasks-per-node 1 tuner search ...``); they meet in the study's database, so it must be one every node
reaches: PostgreSQL, not a SQLite file of one host.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from tuner.errors import ConfigError, SpaceError
from tuner.job.space import Space
from tuner.settings import SlurmStep

MAX_NODES = 64


def node_layout(
    nnodes: int | None,
    nproc_per_node: int | None,
    world_size: int | None,
    slurm: SlurmStep | None,
    option: Callable[[str], str] = str,
) -> tuple[int, int | None]:
    """(nodes, world size) of a search: ``nnodes`` given, else the Slurm step's nodes, else 1; ranks per node given,
    else the GPUs Slurm gave this node, else world size / nodes. The world size is nodes x ranks per node (None: left
    to the baseline, on one node). ConfigError (one line) for a layout that does not add up."""
    if world_size is not None and world_size < 1:
        raise ConfigError(f"{option('world_size')} {world_size}: a probe needs at least 1 rank")
    if (nnodes is not None and nnodes < 1) or (nproc_per_node is not None and nproc_per_node < 1):
        raise ConfigError(f"{option('nnodes')} and {option('nproc_per_node')} must be at least 1")
    nodes = nnodes or (slurm.nnodes if slurm is not None else 1)
    if nodes > MAX_NODES:
        raise ConfigError(f"{option('nnodes')} {nodes} is above {MAX_NODES}")
    if slurm is not None and nnodes is None and slurm.tasks != slurm.nnodes:
        raise ConfigError(
            f"this Slurm step runs {slurm.tasks} tasks on {slurm.nnodes} nodes; a search across nodes runs one tuner "
            f"worker per node: srun -N {slurm.nnodes} --ntasks-per-node 1 tuner search ... (or give {option('nnodes')})"
        )
    if nodes == 1:
        if nproc_per_node is not None and world_size is not None and world_size != nproc_per_node:
            raise ConfigError(f"{option('world_size')} {world_size} is not {option('nproc_per_node')} {nproc_per_node}")
        return 1, world_size or nproc_per_node
    per_node = nproc_per_node or (slurm.gpus_on_node if slurm is not None and nnodes is None else None)
    if per_node is None and world_size is not None and world_size % nodes == 0:
        per_node = world_size // nodes
    if per_node is None:
        raise ConfigError(
            f"a search across {nodes} nodes needs the ranks of each: give {option('nproc_per_node')} (GPUs per node)"
        )
    if world_size is not None and world_size != nodes * per_node:
        raise ConfigError(
            f"{option('world_size')} {world_size} is not {option('nnodes')} {nodes} x {option('nproc_per_node')} "
            f"{per_node}; give two of them"
        )
    return nodes, nodes * per_node


def check_storage(storage: str, nnodes: int, option: Callable[[str], str] = str) -> None:
    """A search across nodes keeps its workers in step through the study's database: SQLite (a file of one host) is
    refused in one line."""
    if nnodes > 1 and storage.strip().lower().startswith("sqlite"):
        raise ConfigError(
            f"a search across {nnodes} nodes keeps its workers in step through the study's database: give a "
            f"PostgreSQL URL every node reaches ({option('storage')} postgresql+psycopg://user@host/db), not SQLite"
        )


def node_space(space: Space, world_size: int, nnodes: int, listed: Collection[str] = ()) -> Space:
    """The across-node knobs of a search: the user's choices where the space lists them, else, across nodes, the
    natural ones beside "none": ZeRO++ hpZ over a node's ranks for ZeRO-3 (its secondary partition then gathers
    inside a node), one FSDP2 replica per node (HSDP: shards inside a node, replicas across). Each choice must divide
    the world size (SpaceError, one line)."""
    per_node = world_size // nnodes
    zero3 = "deepspeed" in space.engine and 3 in space.zero_stage
    if nnodes > 1 and "zero_hpz_partition_size" not in listed and per_node > 1 and zero3:
        space = space.restrict(zero_hpz_partition_size=[None, per_node])
    if nnodes > 1 and "dp_replicate_size" not in listed and "fsdp2" in space.engine:
        space = space.restrict(dp_replicate_size=[None, nnodes])
    for name in ("zero_hpz_partition_size", "dp_replicate_size"):
        bad = [v for v in getattr(space, name) if v and world_size % v]
        if bad:
            raise SpaceError(
                f"knob {name!r}: {bad[0]} does not divide the world size {world_size}; give divisors of it "
                f"(the ranks per node, {per_node}, or the nodes, {nnodes})"
            )
    return space


__all__ = ["MAX_NODES", "check_storage", "node_layout", "node_space"]
