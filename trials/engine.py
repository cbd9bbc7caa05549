"""Training engines of one probe: plain PyTorch (AdamW, optional autocast) and a real DeepSpeed engine built from Knobs.

Both expose the same three things to the probe loop: ``micro_step(batch) -> bool`` (True when that micro-step ended
with an optimizer step), ``module`` (the unwrapped model, for eval/generate) and ``optimizer_for_host()`` (the
optimizer whose state lives in host memory under CPU offload, else None).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Protocol

import torch

from trials.contract import DS_DEFAULT_BUCKET, Knobs


class Engine(Protocol):
    module: torch.nn.Module

    def micro_step(self, batch: dict[str, torch.Tensor]) -> bool: ...

    def host_optimizer(self) -> Any | None: ...

    def host_tensors(self) -> Iterator[torch.Tensor]: ...

    def autocast(self) -> contextlib.AbstractContextManager[Any]: ...


def enable_checkpointing(model: torch.nn.Module) -> None:
    enable = getattr(model, "activation_checkpointing_enable", None) or getattr(
        model, "gradient_checkpointing_enable", None
    )
    if enable is None:
        raise ValueError(f"{type(model).__name__} does not support gradient checkpointing")
    enable()


def _autocast_dtype(precision: str) -> torch.dtype | None:
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)


class TorchEngine:
    """AdamW over an fp32 model; bf16/fp16 through autocast (fp16 with a GradScaler on CUDA); DDP for world > 1."""

    def __init__(
        self, model: torch.nn.Module, knobs: Knobs, accum: int, device: torch.device, lr: float, world_size: int
    ) -> None:
        self.module = model.to(device)
        if knobs.gradient_checkpointing:
            enable_checkpointing(model)
        self.device = device
        self.accum = accum
        self.wrapped: torch.nn.Module = model
        if world_size > 1:
            ids = [device.index] if device.type == "cuda" else None
            self.wrapped = torch.nn.parallel.DistributedDataParallel(
                model,
                device_ids=ids,
                bucket_cap_mb=knobs.reduce_bucket_size * 4 / 2**20 if knobs.reduce_bucket_size else 25.0,
            )
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
        self.dtype = _autocast_dtype(knobs.precision)
        if self.dtype is torch.float16 and device.type != "cuda":
            raise ValueError("fp16 autocast needs a CUDA device; use precision bf16 or fp32 on CPU")
        self.scaler = torch.amp.GradScaler("cuda") if self.dtype is torch.float16 else None
        self.count = 0

    def micro_step(self, batch: dict[str, torch.Tensor]) -> bool:
        self.count += 1
        boundary = self.count % self.accum == 0
        sync: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        if not boundary and isinstance(self.wrapped, torch.nn.parallel.DistributedDataParallel):
            sync = self.wrapped.no_sync()
        with sync:
            with self.autocast():
                loss = self.wrapped(**batch).loss / self.accum
            if self.scaler is not None:
                self.scaler.scale(loss).backward()
            else:
                loss.backward()
        if boundary:
            if self.scaler is not None:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        return boundary

    def host_optimizer(self) -> Any | None:
        return None

    def host_tensors(self) -> Iterator[torch.Tensor]:
        return iter(())

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)


def deepspeed_config(knobs: Knobs, accum: int, world_size: int, lr: float) -> dict[str, Any]:
    """The DeepSpeed JSON for these knobs (tuner/interop/export writes the same mapping for users)."""
    zero: dict[str, Any] = {
        "stage": knobs.zero_stage,
        "overlap_comm": knobs.overlap_comm,
        "contiguous_gradients": knobs.contiguous_gradients,
        "allgather_bucket_size": knobs.allgather_bucket_size or DS_DEFAULT_BUCKET,
        "reduce_bucket_size": knobs.reduce_bucket_size or DS_DEFAULT_BUCKET,
    }
    if knobs.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": torch.cuda.is_available()}
    optimizer_params: dict[str, Any] = {"lr": lr, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0}
    if not knobs.offload_optimizer:
        # torch.optim.AdamW instead of FusedAdam: no 40 s op compile per fresh cache (offload uses DeepSpeedCPUAdam)
        optimizer_params["torch_adam"] = True
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": knobs.micro_batch_size,
        "gradient_accumulation_steps": accum,
        "train_batch_size": knobs.micro_batch_size * accum * world_size,
        "zero_optimization": zero,
        "optimizer": {"type": "AdamW", "params": optimizer_params},
        "gradient_clipping": 1.0,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
        "zero_allow_untested_optimizer": True,
    }
    if knobs.precision == "bf16":
        config["bf16"] = {"enabled": True}
    elif knobs.precision == "fp16":
        config["fp16"] = {"enabled": True, "initial_scale_power": 16, "loss_scale_window": 1000}
    return config


# ZeRO optimizer attributes that live in host memory when the optimizer is offloaded (stages 1-2 and 3)
_ZERO_HOST_BUFFERS = (
    "single_partition_of_fp32_groups",
    "accumulated_grads_in_cpu",
    "temp_grad_buffer_for_cpu_offload",
    "fp32_partitioned_groups_flat",
)


def _tensors_in(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
        if obj.grad is not None:
            yield obj.grad
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors_in(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors_in(v)


class DeepSpeedEngine:
    """A real ``deepspeed.initialize`` engine; the process group must already be initialised."""

    def __init__(
        self, model: torch.nn.Module, knobs: Knobs, accum: int, device: torch.device, lr: float, world_size: int
    ) -> None:
        import deepspeed

        if knobs.gradient_checkpointing:
            enable_checkpointing(model)
        self.config = deepspeed_config(knobs, accum, world_size, lr)
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=model, model_parameters=[p for p in model.parameters() if p.requires_grad], config=self.config
        )
        self.module = self.engine.module
        self.device = self.engine.device
        self.offload = knobs.offload_optimizer

    def micro_step(self, batch: dict[str, torch.Tensor]) -> bool:
        boundary = bool(self.engine.is_gradient_accumulation_boundary())
        loss = self.engine(**batch).loss
        self.engine.backward(loss)
        self.engine.step()
        return boundary

    def host_optimizer(self) -> Any | None:
        """The inner (DeepSpeedCPUAdam) optimizer whose params and state live in host memory under offload."""
        if not self.offload:
            return None
        return getattr(self.optimizer, "optimizer", None)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()  # the engine's module is already in the training precision

    def host_tensors(self) -> Iterator[torch.Tensor]:
        """ZeRO's host-side buffers under CPU offload (on a GPU they are pinned CPU memory, not device memory)."""
        if not self.offload:
            return
        for name in _ZERO_HOST_BUFFERS:
            yield from _tensors_in(getattr(self.optimizer, name, None))


def build_engine(
    model: torch.nn.Module, knobs: Knobs, accum: int, device: torch.device, lr: float, world_size: int
) -> Engine:
    cls = DeepSpeedEngine if knobs.engine == "deepspeed" else TorchEngine
    return cls(model, knobs, accum, device, lr, world_size)
