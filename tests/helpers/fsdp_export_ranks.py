"""One rank of an exported FSDP2 config started under real accelerate code (tests/tuner/interop/test_fsdp_export.py).

The rank gets the environment `accelerate launch --config_file EXPORT` derives from the exported accelerate config
(ACCELERATE_USE_FSDP, FSDP_*, ACCELERATE_MIXED_PRECISION), builds ``FullyShardedDataParallelPlugin()`` from it as
``Accelerator()`` does, sets its mixed precision as AcceleratorState does, and shards builtin:tiny-llama with
accelerate's own ``fsdp2_apply_ac`` / ``fsdp2_prepare_model`` on gloo. accelerate installs its FSDP plugin only for
GPU-like devices (on CPU the Trainer would silently run DDP), so the preparation is driven directly, with an object
carrying what it reads of an Accelerator, as trials/fsdp.py drives it. Each rank writes what it found to
``OUT/rank<r>.json``: whether every parameter came back a DTensor, over how many ranks, and one step's loss."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist


def run_rank(rank: int, world: int, port: int, env: dict[str, str], out: str) -> None:
    # a forked rank: one intra-op thread (no OpenMP pool inherited from the parent is entered; 2 ranks share the
    # host's cores), as torch's DataLoader workers do
    torch.set_num_threads(1)
    os.environ.update(env)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        Path(out, f"rank{rank}.json").write_text(json.dumps(_shard_and_step(rank)))
    finally:
        dist.destroy_process_group()


def _shard_and_step(rank: int) -> dict[str, object]:
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import fsdp2_apply_ac, fsdp2_prepare_model
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    from trials.contract import ModelSpec
    from trials.models import build_model

    torch.manual_seed(0)
    plugin = FullyShardedDataParallelPlugin()  # from the launcher's FSDP_* variables, as Accelerator() builds it
    mixed = os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
    if mixed != "no":
        plugin.set_mixed_precision(mixed)
    accelerator = SimpleNamespace(
        state=SimpleNamespace(fsdp_plugin=plugin),
        mixed_precision=mixed,
        is_main_process=rank == 0,
        device=torch.device("cpu"),
        torch_device_mesh=None,
    )
    model = build_model(ModelSpec(source="builtin:tiny-llama"))
    plugin.set_auto_wrap_policy(model)
    if plugin.activation_checkpointing:
        model = fsdp2_apply_ac(accelerator, model)
    model = fsdp2_prepare_model(accelerator, model)
    params = list(model.parameters())
    ids = torch.randint(0, int(model.config.vocab_size), (2, 16))
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return {
        "params": len(params),
        "dtensors": sum(isinstance(p, DTensor) for p in params),
        "mesh_sizes": sorted({p.device_mesh.size() for p in params if isinstance(p, DTensor)}),
        "groups": sum(isinstance(m, FSDPModule) for m in model.modules()),
        "fsdp_version": plugin.fsdp_version,
        "reshard_after_forward": plugin.reshard_after_forward,
        "activation_checkpointing": plugin.activation_checkpointing,
        "param_dtype": str(plugin.mixed_precision_policy.param_dtype) if plugin.mixed_precision_policy else None,
        "loss": float(loss.detach().full_tensor() if isinstance(loss, DTensor) else loss.detach()),
    }
