"""What an offloading engine keeps in host memory, taken off the emulated device (trials.memory.LiveTensorTracker):
ZeRO's optimizer buffers under optimizer offload, ZeRO-3's parameter partitions under parameter offload, and the
offloaded optimizer's state, whose step is paused from the count (it runs on the host)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from trials import memory
from trials.memory import LiveTensorTracker

# ZeRO optimizer attributes that live in host memory when the optimizer is offloaded (stages 1-2 and 3)
_ZERO_HOST_BUFFERS = (
    "single_partition_of_fp32_groups",
    "accumulated_grads_in_cpu",
    "temp_grad_buffer_for_cpu_offload",
    "param_buffer_of_bit16_for_cpu_offload_groups",  # stage 1/2: one partition, pinned host memory on a GPU
    "fp32_partitioned_groups_flat",
)
# ZeRO-3 attributes that live in host memory under parameter offload (the partitions' flat 16-bit buffers)
_ZERO3_PARAM_HOST_BUFFERS = ("fp16_partitioned_groups_flat", "param_groups_fp16_flat_cpu_memory")


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


def zero_host_tensors(
    module: torch.nn.Module, optimizer: Any, offload_optimizer: bool, offload_param: bool
) -> Iterator[torch.Tensor]:
    """ZeRO's host-side buffers under CPU offload (on a GPU they are pinned CPU memory, not device memory): the
    optimizer's, and under ZeRO-3's parameter offload each parameter's partition (``ds_tensor``) and their flat
    buffers."""
    if offload_param:
        for param in module.parameters():
            part = getattr(param, "ds_tensor", None)
            if isinstance(part, torch.Tensor):
                yield part
        for name in _ZERO3_PARAM_HOST_BUFFERS:
            yield from _tensors_in(getattr(optimizer, name, None))
    if offload_optimizer:
        for name in _ZERO_HOST_BUFFERS:
            yield from _tensors_in(getattr(optimizer, name, None))


def host_offload(engine: Any, tracker: LiveTensorTracker | None) -> None:
    """An engine's offloaded optimizer state lives in host memory: taken off the emulated device, its step paused
    (the probe after every micro-step, and the FSDP2 trace the same way)."""
    if tracker is None:
        return
    if getattr(engine, "offload_param", False):  # ZeRO-3's offloaded parameter partitions (each step may make new)
        tracker.mark_host(engine.host_tensors())
    host = engine.host_optimizer()
    if host is None:
        return
    tracker.mark_host(memory.optimizer_tensors(host))
    tracker.mark_host(engine.host_tensors())
    if not getattr(host, "_tuner_paused", False):
        step = host.step

        def paused_step(*args: Any, **kwargs: Any) -> Any:
            with tracker.paused():
                return step(*args, **kwargs)

        host.step = paused_step
        host._tuner_paused = True
