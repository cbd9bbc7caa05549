"""Exports of a pick measured across nodes (pure): what makes each tool start it on its nodes.

* accelerate: ``num_machines``, ``machine_rank`` (each node's: 0 in the file, given per node on the command line),
  ``main_process_ip`` / ``main_process_port`` (the first node; the user's own values kept), ``rdzv_backend: c10d``
  with ``same_network: false`` (accelerate then launches torchrun with ``--rdzv-endpoint ip:port``, no node rank
  needed), and for an HSDP pick its ``parallelism_config`` (``dp_replicate_size`` x ``dp_shard_size``);
* the environment: the variables `accelerate launch` sets for that parallelism config (so ``Accelerator()`` under a
  bare torchrun builds the same device mesh) and TUNER_NNODES;
* ``launch``: the torchrun, accelerate and srun lines to run on every node, c10d rendezvous, no ssh.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from trials.contract import Knobs

MAIN_PORT = 29500
#: what the exported accelerate config names the first node by when the user's own config names none: each node's
#: launch line gives the real one (--main_process_ip), as the header and `tuner best --format launch` say
MAIN_PLACEHOLDER = "FIRST_NODE_ADDRESS"


def machines_block(nnodes: int, given: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The accelerate config keys of a run on ``nnodes`` machines (none for one machine)."""
    if nnodes <= 1:
        return {}
    given = given or {}
    return {
        "num_machines": nnodes,
        "machine_rank": 0,
        "main_process_ip": given.get("main_process_ip") or MAIN_PLACEHOLDER,
        "main_process_port": given.get("main_process_port") or MAIN_PORT,
        "rdzv_backend": "c10d",
        "same_network": False,
    }


def replicas(k: Knobs) -> int:
    return k.dp_replicate_size or 1


def parallelism_block(k: Knobs, world_size: int) -> dict[str, Any]:
    """An HSDP pick's accelerate ``parallelism_config`` (replicas x shards = the world); none otherwise."""
    if k.engine != "fsdp2" or replicas(k) <= 1:
        return {}
    return {
        "parallelism_config_dp_replicate_size": replicas(k),
        "parallelism_config_dp_shard_size": world_size // replicas(k),
    }


def parallelism_env(k: Knobs, world_size: int) -> dict[str, str]:
    """What `accelerate launch` sets for an HSDP pick's parallelism config (accelerate.utils.launch)."""
    block = parallelism_block(k, world_size)
    if not block:
        return {}
    return {
        "ACCELERATE_USE_PARALLELISM_CONFIG": "true",
        "PARALLELISM_CONFIG_DP_REPLICATE_SIZE": str(block["parallelism_config_dp_replicate_size"]),
        "PARALLELISM_CONFIG_DP_SHARD_SIZE": str(block["parallelism_config_dp_shard_size"]),
    }


def accelerate_header(nnodes: int) -> str:
    """The comment lines an accelerate config across machines starts with."""
    if nnodes <= 1:
        return ""
    return (
        f"# {nnodes} machines: the same file on every node, each launched with its own rank and the first node's "
        f"address:\n#   accelerate launch --config_file THIS_FILE --machine_rank NODE_RANK --main_process_ip "
        f"FIRST_NODE --rdzv_backend c10d train.py   (tuner best --format launch prints the lines)\n"
    )


def launch_text(knobs: Knobs, *, world_size: int, nnodes: int, env: Mapping[str, str], study: str = "STUDY") -> str:
    """The lines that start the pick on its nodes: the environment, then torchrun (c10d rendezvous), accelerate and
    Slurm's srun, each to run on every node. No ssh: every node runs its own line."""
    per_node = world_size // nnodes
    engine = "--deepspeed ds_config.json" if knobs.engine == "deepspeed" else ""
    files = (
        f"tuner best --study {study} --format deepspeed -o ds_config.json"
        if knobs.engine == "deepspeed"
        else f"tuner best --study {study} --format accelerate -o accelerate.yaml"
    )
    exports = "".join(f"export {name}={shlex.quote(value)}\n" for name, value in env.items())
    script = f"train.py {engine}".strip()
    if nnodes <= 1:
        run = f"torchrun --standalone --nproc-per-node {per_node} {script}\n"
        return f"# the pick on one node x {per_node} ranks\n# the files: {files}\n{exports}{run}"
    rdzv = f"--nnodes {nnodes} --nproc-per-node {per_node} --rdzv-backend c10d"
    slurm_main = '"$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)"'
    return (
        f"# the pick on {nnodes} nodes x {per_node} ranks: every node runs the same line (c10d rendezvous, no ssh)\n"
        f"# the files: {files}; MAIN: the first node's address, reachable from the others\n"
        f"{exports}"
        f'torchrun {rdzv} --rdzv-endpoint "$MAIN:{MAIN_PORT}" --rdzv-id "$JOB_ID" {script}\n'
        f"# or with accelerate (the same accelerate.yaml on every node, this node's rank given):\n"
        f'accelerate launch --config_file accelerate.yaml --machine_rank "$NODE_RANK" --main_process_ip "$MAIN" '
        f"--main_process_port {MAIN_PORT} --rdzv_backend c10d train.py\n"
        f"# under Slurm (one task per node):\n"
        f"srun -N {nnodes} --ntasks-per-node 1 bash -c 'torchrun {rdzv} --rdzv-endpoint "
        f'{slurm_main}:{MAIN_PORT} --rdzv-id "$SLURM_JOB_ID" {script}\'\n'
    )


__all__ = [
    "MAIN_PLACEHOLDER",
    "MAIN_PORT",
    "accelerate_header",
    "launch_text",
    "machines_block",
    "parallelism_block",
    "parallelism_env",
]
