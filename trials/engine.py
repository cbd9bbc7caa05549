"""Training engines of one probe: plain PyTorch (the Trainer's AdamW, autocast, clipping) and a real DeepSpeed engine
built from the job's DeepSpeed JSON (ProbeConfig.deepspeed, the export's).

Both expose the same three things to the probe loop: ``micro_step(batch) -> bool`` (True when that micro-step ended
with an optimizer step), ``module`` (the unwrapped model, for eval/generate) and ``optimizer_for_host()`` (the
optimizer whose state lives in host memory under CPU offload, else None).
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

import torch

from trials.contract import AUTO, DS_HOST_KEYS, ProbeConfig, auto_paths, needed_ops
from trials.host_memory import host_offload as host_offload  # re-exported: the probe and the FSDP2 trace use it
from trials.host_memory import zero_host_tensors
from trials.models import is_encoder_decoder
from trials.outcome import ConfigRefused
from trials.pinned import pinned_parts, pinned_setup
from trials.trainer_args import (
    build_optimizer,
    checkpointing_kwargs,
    compile_options,
    compiled,
    ddp_kwargs,
    loss_function,
)


class Engine(Protocol):
    module: torch.nn.Module
    loss: Callable[[Any, dict[str, torch.Tensor]], Any]  # the micro-step's loss (their Trainer's, or DPO's)

    def micro_step(self, batch: dict[str, torch.Tensor]) -> bool: ...

    def host_optimizer(self) -> Any | None: ...

    def host_tensors(self) -> Iterator[torch.Tensor]: ...

    def autocast(self) -> contextlib.AbstractContextManager[Any]: ...

    def skipped_steps(self) -> int: ...  # optimizer steps skipped so far (fp16 loss-scale overflow)

    # where the engine's setup went, seconds (and pinned GiB): the probe's setup_phases as "engine.<part>"
    parts: dict[str, float]


def enable_checkpointing(model: torch.nn.Module, kwargs: dict[str, Any] | None = None) -> None:
    """The model's own checkpointing switch, with their checkpointing keywords (use_reentrant ...; transformers 5.25's
    every_n_layers and offload taken out first) as their Trainer passes them (trials.trainer_args.
    checkpointing_kwargs); activation offload to the host is a GPU host's: refused on the emulated device."""
    given = dict(kwargs or {})
    every_n, offload = given.pop("every_n_layers", 1), given.pop("offload", False)
    if offload and not torch.cuda.is_available():
        raise ConfigRefused(
            "activation checkpointing with offload moves saved activations to pinned host memory, which the "
            "emulated CPU device cannot tell apart: search it on a GPU host, or without offload"
        )
    extra = {"every_n_layers": every_n, "offload": offload} if every_n != 1 or offload else {}
    named: Any = model
    if hasattr(named, "activation_checkpointing_enable"):
        named.activation_checkpointing_enable(activation_checkpointing_kwargs=given or None, **extra)
    elif hasattr(named, "gradient_checkpointing_enable"):
        named.gradient_checkpointing_enable(gradient_checkpointing_kwargs=given or None, **extra)
    else:
        raise ValueError(f"{type(model).__name__} does not support gradient checkpointing")
    input_grads = getattr(model, "enable_input_require_grads", None)
    if input_grads is not None and any(not p.requires_grad for p in model.parameters()):
        # a frozen base (LoRA): the checkpointed blocks' inputs must require grad, or (reentrant) checkpointing
        # passes no gradient to the adapters inside them; what peft and the Trainer do for PEFT models
        input_grads()


def _autocast_dtype(precision: str) -> torch.dtype | None:
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)


class TorchEngine:
    """The Trainer's plain path: AdamW (client_optimizer) over an fp32 model, bf16/fp16 through autocast (fp16 with a
    GradScaler on CUDA), gradient clipping at the job's max_grad_norm; DDP for world > 1."""

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
        self.max_grad_norm = config.job.max_grad_norm
        self.module = model.to(device)
        if knobs.gradient_checkpointing:
            enable_checkpointing(model, checkpointing_kwargs(args))
        self.device = device
        self.accum = accum
        self.wrapped: torch.nn.Module = model
        if world_size > 1:
            self.wrapped = torch.nn.parallel.DistributedDataParallel(model, **ddp_kwargs(knobs, device, args))
        # the Trainer's optimizer (a frozen base has no state): Trainer.create_optimizer on their arguments
        self.optimizer = build_optimizer(model, args, config.learning_rate, device.type == "cuda")
        self.loss = loss_function(args, not is_encoder_decoder(model))
        self.parts: dict[str, float] = {}
        self.wrapped = compiled(self.wrapped, args, self.parts, config.job.compile)
        self.dtype = _autocast_dtype(knobs.precision)
        if self.dtype is torch.float16 and device.type != "cuda":
            raise ValueError("fp16 autocast needs a CUDA device; use precision bf16 or fp32 on CPU")
        self.scaler = torch.amp.GradScaler("cuda") if self.dtype is torch.float16 else None
        self.count = 0
        self.skipped = 0

    def micro_step(self, batch: dict[str, torch.Tensor]) -> bool:
        self.count += 1
        boundary = self.count % self.accum == 0
        sync: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        if not boundary and isinstance(self.wrapped, torch.nn.parallel.DistributedDataParallel):
            sync = self.wrapped.no_sync()
        with sync:
            with self.autocast():
                loss = self.loss(self.wrapped, batch) / self.accum
            if self.scaler is not None:
                self.scaler.scale(loss).backward()
            else:
                loss.backward()
        if boundary:
            if self.max_grad_norm > 0:
                if self.scaler is not None:
                    self.scaler.unscale_(self.optimizer)
                torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.max_grad_norm)
            if self.scaler is not None:
                scale = self.scaler.get_scale()
                self.scaler.step(self.optimizer)
                self.scaler.update()
                if self.scaler.get_scale() < scale:  # the scaler found inf/nan grads: it skipped the step
                    self.skipped += 1
            else:
                self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        return boundary

    def host_optimizer(self) -> Any | None:
        return None

    def skipped_steps(self) -> int:
        return self.skipped

    def host_tensors(self) -> Iterator[torch.Tensor]:
        return iter(())

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)


# Model-sized "auto" values of a ZeRO config, resolved from the hidden size as the HF Trainer does
# (transformers' HfTrainerDeepSpeedConfig.trainer_config_finalize).
def _model_sized(hidden: int) -> dict[str, int]:
    return {
        "reduce_bucket_size": hidden * hidden,
        "stage3_prefetch_bucket_size": int(0.9 * hidden * hidden),
        "stage3_param_persistence_threshold": 10 * hidden,
    }


_ADAM_TYPES = {"adam", "adamw"}


def probe_deepspeed_config(
    user: Mapping[str, Any], *, micro_batch_size: int, accum: int, world_size: int, cuda: bool, hidden_size: int
) -> dict[str, Any]:
    """The user's DeepSpeed JSON (ProbeConfig.deepspeed, what the export writes) as one probe rank runs it.

    Only these change, each because of how a probe runs, not what the job computes:
    - the batch fields at the probe's accumulation (it times min(accum, 2) micro-steps; the runner composes the cycle);
    - DS_HOST_KEYS dropped (profilers and monitors write the user's files), steps_per_print silenced;
    - the model-sized "auto" values resolved from the hidden size, as the Trainer resolves them;
    - no optimizer section: the HF Trainer passes its own optimizer (see client_optimizer) and sets
      zero_allow_untested_optimizer, so the probe does too;
    - on CPU (the emulated device) only: Adam/AdamW runs torch's AdamW instead of the CUDA-only FusedAdam, and
      offload buffers are not pinned (pinning needs CUDA). Offloaded Adam is DeepSpeedCPUAdam on both.
    Any other "auto" left is a ValueError naming it (the baseline import resolves the training-args ones).
    """
    ds: dict[str, Any] = copy.deepcopy(dict(user))
    for key in DS_HOST_KEYS:
        ds.pop(key, None)
    ds["train_micro_batch_size_per_gpu"] = micro_batch_size
    ds["gradient_accumulation_steps"] = accum
    ds["train_batch_size"] = micro_batch_size * accum * world_size
    ds["steps_per_print"] = 10**9
    zero = ds.setdefault("zero_optimization", {})
    for key, value in _model_sized(hidden_size).items():
        if zero.get(key) == AUTO:
            zero[key] = value
    offload = (zero.get("offload_optimizer") or {}).get("device", "none") != "none"
    optimizer = ds.get("optimizer")
    if optimizer is None:
        ds["zero_allow_untested_optimizer"] = True
    elif not cuda and not offload and str(optimizer.get("type", "")).lower() in _ADAM_TYPES:
        optimizer["params"] = {**(optimizer.get("params") or {}), "torch_adam": True}
    if not cuda:
        for name in ("offload_optimizer", "offload_param"):
            if isinstance(zero.get(name), dict) and zero[name].get("pin_memory"):
                zero[name] = {**zero[name], "pin_memory": False}
    left = auto_paths(ds)
    if left:
        raise ValueError(f"the DeepSpeed config leaves {', '.join(left)} as 'auto' and nothing resolves it")
    return ds


class DeepSpeedEngine:
    """A real ``deepspeed.initialize`` engine; the process group must already be initialised."""

    def __init__(
        self,
        model: torch.nn.Module,
        config: ProbeConfig,
        accum: int,
        device: torch.device,
        world_size: int,
        args: Any | None = None,
    ) -> None:
        import deepspeed

        knobs = config.knobs
        if config.deepspeed is None:
            raise ValueError(
                "ProbeConfig.deepspeed is unset for engine 'deepspeed': build the probe config with "
                "tuner.probing.config.probe_config, which writes the job's DeepSpeed JSON"
            )
        cuda = device.type == "cuda"
        if (knobs.zero_quantized_weights or knobs.zero_quantized_gradients) and not cuda:
            from trials.outcome import ConfigRefused

            raise ConfigRefused(
                "ZeRO++ quantized weights / gradients run DeepSpeed's CUDA quantizer kernels, which have no CPU "
                "implementation: probe them on GPU nodes, or leave zero_quantized_* out of the space"
            )
        if knobs.gradient_checkpointing:
            enable_checkpointing(model, checkpointing_kwargs(args))
        self.loss = loss_function(args, not is_encoder_decoder(model))
        self.config = probe_deepspeed_config(
            config.deepspeed,
            micro_batch_size=knobs.micro_batch_size,
            accum=accum,
            world_size=world_size,
            cuda=cuda,
            hidden_size=hidden_size(model),
        )
        params = [p for p in model.parameters() if p.requires_grad]
        start = time.monotonic()
        load_ops(config, cuda)
        self.parts: dict[str, float] = {
            "ops": time.monotonic() - start
        }  # where the engine's setup went (RankResult.setup_phases)
        # no optimizer section: their Trainer passes its own (Trainer.create_optimizer on their arguments)
        client = None if "optimizer" in self.config else build_optimizer(model, args, config.learning_rate, cuda)
        with pinned_setup(cuda) as pinned:  # the probe's pinned-memory variant (trials.pinned), its setup only
            self.engine, self.optimizer, _, _ = deepspeed.initialize(
                model=model, model_parameters=params, optimizer=client, config=self.config
            )
        self.parts["initialize"] = time.monotonic() - start - self.parts["ops"]
        options = compile_options(args, config.job.compile)
        if options is not None:  # their Trainer compiles DeepSpeed's engine through accelerate: engine.compile
            began = time.monotonic()
            backend = options.pop("backend")
            self.engine.compile(backend=backend, compile_kwargs=options)
            self.parts["compile"] = time.monotonic() - began
        if cuda:
            self.parts.update(pinned_parts(torch.cuda.host_memory_stats()))
            for name, value in pinned.parts().items():  # pinned in place: torch's host allocator never saw it
                self.parts[name] = self.parts.get(name, 0.0) + value
        self.module = self.engine.module
        self.device = self.engine.device
        self.offload = knobs.offload_optimizer
        self.offload_param = knobs.offload_param

    def micro_step(self, batch: dict[str, torch.Tensor]) -> bool:
        boundary = bool(self.engine.is_gradient_accumulation_boundary())
        loss = self.loss(self.engine, batch)
        self.engine.backward(loss)
        self.engine.step()
        return boundary

    def skipped_steps(self) -> int:
        """DeepSpeed's count of optimizer steps skipped on fp16 overflow (DeepSpeedEngine.skipped_steps)."""
        return int(getattr(self.engine, "skipped_steps", 0) or 0)

    def host_optimizer(self) -> Any | None:
        """The inner (DeepSpeedCPUAdam) optimizer whose params and state live in host memory under offload."""
        if not self.offload:
            return None
        return getattr(self.optimizer, "optimizer", None)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()  # the engine's module is already in the training precision

    def host_tensors(self) -> Iterator[torch.Tensor]:
        """ZeRO's host-side buffers under CPU offload (on a GPU they are pinned CPU memory, not device memory): the
        optimizer's, and under ZeRO-3's parameter offload each parameter's partition (``ds_tensor``) and their flat
        buffers."""
        return zero_host_tensors(self.module, self.optimizer, self.offload, self.offload_param)


def load_ops(config: ProbeConfig, cuda: bool) -> None:
    """Loads the JIT ops ``deepspeed.initialize`` will load for ``config`` (built before the probe: the runner refuses
    a config whose op it could not build), so their load is timed apart from the engine's own setup; shm_comm is
    init_distributed's."""
    from deepspeed.accelerator import get_accelerator

    from trials.ops import OPS

    for key in needed_ops(config, gpu_host=cuda):
        if key != "shm_comm":
            builder = get_accelerator().create_op_builder(OPS[key])
            if builder is not None:
                builder.load(verbose=False)


def hidden_size(model: torch.nn.Module) -> int:
    """The model's hidden size as the Trainer reads it for model-sized "auto" values (d_model for T5)."""
    return hidden_size_of_config(getattr(model, "config", None), type(model).__name__)


def hidden_size_of_config(config: Any, name: str = "the model") -> int:
    """The hidden size of a model config (``hidden_size``, or ``d_model`` for T5)."""
    for name_ in ("hidden_size", "d_model"):
        value = getattr(config, name_, None)
        if isinstance(value, int):
            return value
    raise ValueError(f"{name} has no hidden_size or d_model in its config")


def build_engine(
    model: torch.nn.Module,
    config: ProbeConfig,
    accum: int,
    device: torch.device,
    world_size: int,
    args: Any | None = None,
) -> Engine:
    """The config's engine over ``model``; ``args``: the probe's TrainingArguments (trials.trainer_args: what their
    Trainer builds its optimizer, loss, compile and checkpointing from), None for a job without training args."""
    if config.knobs.engine == "fsdp2":
        from trials.fsdp import FsdpEngine

        return FsdpEngine(model, config, accum, device, world_size, args)
    cls = DeepSpeedEngine if config.knobs.engine == "deepspeed" else TorchEngine
    return cls(model, config, accum, device, world_size, args)
