"""The FSDP2 engine of one probe: the model sharded with ``fully_shard`` the way accelerate's FSDP2 preparation shards
it for the user's Trainer (``fsdp_version: 2``), trained as the Trainer trains it.

accelerate installs its FSDP plugin only on GPU-like devices: on CPU the Trainer silently runs DDP when asked for FSDP.
A probe shards for real everywhere: it drives accelerate's own ``fsdp2_apply_ac`` (activation checkpointing) and
``fsdp2_prepare_model`` (per-block ``fully_shard`` by the wrap policy, the embedding and tail groups, the fp32 upcast of
trainable parameters under mixed precision) with an accelerator that carries only what they read, so the wrapping,
the mixed precision policy and the offload policy are the installed accelerate's, on gloo as on NCCL.

The step is the Trainer's under FSDP2: the optimizer built on the sharded parameters after preparation, gradient
sync off on the accumulation's inner micro-steps (accelerate's ``no_sync``: ``set_requires_gradient_sync``), gradient
clipping at the job's max_grad_norm, no autocast (accelerate wraps no FSDP2 forward in one: the policy casts).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import torch

from trials.contract import FsdpSettings, ProbeConfig
from trials.memory import local_shard
from trials.models import is_encoder_decoder
from trials.outcome import ConfigRefused
from trials.trainer_args import build_optimizer, compiled, loss_function

# what the installed accelerate says when a model shares one Parameter between modules it puts in two FSDP groups
# (T5: shared / encoder.embed_tokens / decoder.embed_tokens under torch >= 2.13)
SHARED_PARAMETER = "is shared with a parameter already managed by another FSDP group"


class FsdpRefusal(ConfigRefused):
    """An FSDP2 config the installed accelerate / torch refuse for this model (not a memory verdict): the probe's
    status "refused", with this reason."""


def plugin(config: ProbeConfig, cuda: bool) -> Any:
    """accelerate's FullyShardedDataParallelPlugin for the probe's knobs and the user's FSDP settings (fsdp_version 2),
    its mixed precision set as AcceleratorState sets it. On CPU (the emulated device) only, the offloaded shards are
    not pinned (pinning needs CUDA), as DeepSpeed's offload buffers are not."""
    from accelerate.utils import FullyShardedDataParallelPlugin

    knobs = config.knobs
    held = config.fsdp or FsdpSettings()
    names = list(held.transformer_layer_cls_to_wrap) or None
    fsdp = FullyShardedDataParallelPlugin(
        fsdp_version=2,
        reshard_after_forward=knobs.reshard_after_forward,
        cpu_offload=knobs.offload_params,
        activation_checkpointing=knobs.gradient_checkpointing,
        auto_wrap_policy=held.auto_wrap_policy.lower(),
        transformer_cls_names_to_wrap=names,
        min_num_params=held.min_num_params if held.auto_wrap_policy == "SIZE_BASED_WRAP" else None,
        state_dict_type=held.state_dict_type,
        cpu_ram_efficient_loading=False,  # the probe builds its model on every rank (a load, not a training, cost)
    )
    if knobs.precision != "fp32":
        fsdp.set_mixed_precision(knobs.precision)
    if knobs.offload_params and not cuda:
        from torch.distributed.fsdp import CPUOffloadPolicy

        fsdp.cpu_offload = CPUOffloadPolicy(pin_memory=False)
    return fsdp


def _accelerator(
    fsdp: Any, precision: str, device: torch.device, rank: int, hsdp: tuple[Any, Any] | None = None
) -> SimpleNamespace:
    """What accelerate's FSDP2 preparation reads of an Accelerator, and nothing else; ``hsdp``: the parallelism config
    and its device mesh of a replicated (HSDP) config."""
    return SimpleNamespace(
        state=SimpleNamespace(fsdp_plugin=fsdp),
        mixed_precision="no" if precision == "fp32" else precision,
        is_main_process=rank == 0,
        device=device,
        parallelism_config=hsdp[0] if hsdp is not None else None,
        torch_device_mesh=hsdp[1] if hsdp is not None else None,
    )


def hsdp_mesh(config: ProbeConfig, device_type: str) -> tuple[Any, Any] | None:
    """HSDP (``dp_replicate_size`` > 1): accelerate's ParallelismConfig of the user's Accelerator
    (``parallelism_config_dp_replicate_size`` x ``dp_shard_size`` = the world) and the 2-D device mesh it builds
    (replicate x shard; fully_shard then shards over a replica's ranks and all-reduces across replicas); None for
    plain FSDP2. (The estimate traces HSDP as plain FSDP2 on a replica's ranks: tuner.memory.trace.shard_world.)"""
    replicate = config.knobs.dp_replicate_size or 1
    if replicate <= 1:
        return None
    from accelerate.parallelism_config import ParallelismConfig

    parallelism = ParallelismConfig(dp_replicate_size=replicate, dp_shard_size=config.world_size // replicate)
    return parallelism, parallelism.build_device_mesh(device_type)


def shard(model: torch.nn.Module, config: ProbeConfig, device: torch.device, rank: int) -> torch.nn.Module:
    """``model`` sharded as accelerate's ``_prepare_fsdp2`` shards it: wrap policy, activation checkpointing, then
    ``fsdp2_prepare_model`` (on the HSDP mesh of ``hsdp_mesh`` when the config replicates). A model the installed
    accelerate cannot shard is an FsdpRefusal naming the fix."""
    from accelerate.utils.fsdp_utils import fsdp2_apply_ac, fsdp2_prepare_model

    fsdp = plugin(config, device.type == "cuda")
    acc = _accelerator(fsdp, config.knobs.precision, device, rank, hsdp_mesh(config, device.type))
    fsdp.set_auto_wrap_policy(model)
    if fsdp.activation_checkpointing:
        model = fsdp2_apply_ac(acc, model)
    return fsdp2_prepare_model(acc, model)


def refusal(exc: BaseException) -> FsdpRefusal | None:
    """The FsdpRefusal an exception of a first FSDP2 forward means, if any (one line, with what would fix it)."""
    text = str(exc)
    if SHARED_PARAMETER in text:
        name = text.split("'")[1] if text.count("'") >= 2 else "a parameter"
        return FsdpRefusal(
            f"FSDP2 cannot shard this model: parameter {name!r} is shared by modules accelerate puts in different "
            "FSDP groups (as T5's shared / embed_tokens); untie those weights, or search engine deepspeed"
        )
    return None


def sharded(module: torch.nn.Module) -> bool:
    """Whether every parameter of ``module`` is a DTensor (fully_shard replaced it by its shard)."""
    from torch.distributed.tensor import DTensor

    params = list(module.parameters())
    return bool(params) and all(isinstance(p, DTensor) for p in params)


class FsdpEngine:
    """accelerate's FSDP2 preparation of the model, the Trainer's optimizer on its shards, the Trainer's step."""

    def __init__(
        self,
        model: torch.nn.Module,
        config: ProbeConfig,
        accum: int,
        device: torch.device,
        world_size: int,
        args: Any | None = None,
    ) -> None:
        knobs = config.knobs
        cuda = device.type == "cuda"
        if knobs.precision == "fp16" and not cuda:
            raise ValueError("fp16 needs a CUDA device (its grad scaler); use precision bf16 or fp32 on CPU")
        start = time.monotonic()
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        self.module = shard(model, config, device, rank)
        self.parts: dict[str, float] = {"shard": time.monotonic() - start}
        self.sharded = sharded(self.module)  # RankResult.sharded: what the Trainer runs is sharded, not replicated
        if not self.sharded:
            raise RuntimeError("accelerate's FSDP2 preparation left parameters unsharded (not DTensor shards)")
        # the Trainer builds its optimizer after FSDP2 preparation, on the sharded parameters (Trainer.create_optimizer
        # on their arguments); offloaded shards live on the host
        self.optimizer = build_optimizer(self.module, args, config.learning_rate, cuda and not knobs.offload_params)
        self.loss = loss_function(args, not is_encoder_decoder(model))
        self.module = compiled(self.module, args, self.parts, config.job.compile)
        self.accum = accum
        self.max_grad_norm = config.job.max_grad_norm
        self.offload = knobs.offload_params
        self.scaler = None
        if knobs.precision == "fp16":
            from accelerate.utils import get_fsdp2_grad_scaler

            self.scaler = get_fsdp2_grad_scaler(device=device.type)
        self.count = 0
        self.skipped = 0
        self._checked = False

    def micro_step(self, batch: dict[str, torch.Tensor]) -> bool:
        self.count += 1
        boundary = self.count % self.accum == 0
        module: Any = self.module
        module.set_requires_gradient_sync(boundary)
        try:
            loss = self._forward(batch) / self.accum
            (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
        finally:
            module.set_requires_gradient_sync(True)
        if boundary:
            self._step()
        return boundary

    def _forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if self._checked:
            return self.loss(self.module, batch)
        try:
            loss = self.loss(self.module, batch)
        except Exception as exc:
            reason = refusal(exc)
            if reason is not None:
                raise reason from None
            raise
        self._checked = True
        return loss

    def _step(self) -> None:
        if self.scaler is not None and self.max_grad_norm > 0:
            self.scaler.unscale_(self.optimizer)
        if self.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.max_grad_norm)
        if self.scaler is not None:
            scale = self.scaler.get_scale()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            if self.scaler.get_scale() < scale:
                self.skipped += 1
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def skipped_steps(self) -> int:
        return self.skipped

    def host_optimizer(self) -> Any | None:
        """The optimizer, whose parameters (the shards), gradients and state live on the host under offload_params."""
        return self.optimizer if self.offload else None

    def host_tensors(self) -> Iterator[torch.Tensor]:
        """The local shards under offload_params (parameters and gradients: DTensors whose storage is their local)."""
        if not self.offload:
            return
        for p in self.module.parameters():
            yield local_shard(p)
            if p.grad is not None:
                yield local_shard(p.grad)
        for state in self.optimizer.state.values():
            for v in state.values():
                if isinstance(v, torch.Tensor):
                    yield local_shard(v)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()  # the mixed precision policy casts; accelerate adds no autocast under FSDP2
