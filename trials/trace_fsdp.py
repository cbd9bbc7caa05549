"""The FSDP2 memory trace: a probe rank of an FSDP2 config, run in one process on fake tensors.

FSDP2's memory is not the plain trace plus arithmetic: which blocks' parameters are gathered at the peak, the
unsharded gradients kept under ``no_sync``, the all-gather and reduce-scatter buffers, the mixed precision policy's
casts and the offload policy all depend on how ``fully_shard`` schedules them. So the trace runs what the probe runs:
the same ``trials.fsdp.FsdpEngine`` (accelerate's own FSDP2 preparation) on rank 0 of a ``fake`` process group of the
config's world size (collectives are no-ops; every shape, storage resize and free is the real one), under
FakeTensorMode (no data: a large model traces without its memory) and the live-tensor tracker the emulated device
uses, with the probe's memory window (a step to create the optimizer state, then one steady accumulation cycle) and
its eval forward and generate. By construction it reads what a 2-rank gloo probe measures (tiny-llama, micro 2 x 64:
3,070,744 vs 3,070,768 bytes). The ranks of an FSDP2 group hold equal, padded shards: rank 0 stands for all.

Everything is reported in bytes, the phases above ``states_bytes`` (what is live at a steady cycle's start: the
parameter shards and the optimizer state on the device; no grads after the step's zero_grad, no batch), as
:class:`tuner.memory.trace.FsdpPoint`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from trials.contract import FsdpSettings, JobSettings, Knobs, LoraSpec, ModelSpec, ProbeConfig
from trials.contract_job import PaddingFree
from trials.engine import host_offload
from trials.eval_pile import eval_forward
from trials.memory import LiveTensorTracker, module_tensors
from trials.models import is_encoder_decoder
from trials.trace_model import build, worst_batch
from trials.trace_modes import cuda_kernels, masks_decided_as_on_real_tensors, packing_decided_as_on_real_tensors
from trials.trace_trainer import TracedTrainer
from trials.trainer_args import prepare_model, their_forward
from trials.trl_head import fuse, step_loss


@contextlib.contextmanager
def fake_group(world_size: int) -> Iterator[None]:
    """A ``fake`` process group of ``world_size`` ranks, this process rank 0, and its 1-D device mesh made before any
    fake tensor exists (building a mesh reads data, which FakeTensorMode refuses): ``fully_shard``'s default mesh."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp._fully_shard import _fsdp_init, _fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=0, world_size=world_size, store=FakeStore())
    mesh = init_device_mesh("cpu", (world_size,))
    modules: list[Any] = [_fsdp_init, _fully_shard]
    saved = [(m, m._init_default_mesh) for m in modules if hasattr(m, "_init_default_mesh")]
    try:
        for module, _ in saved:
            module._init_default_mesh = lambda *args, **kwargs: mesh
        yield
    finally:
        for module, original in saved:
            module._init_default_mesh = original
        dist.destroy_process_group()


class _Gathered:
    """FSDP2's unsharded parameter storages (the ones it resizes in place): their bytes live now and at the tracker's
    peak, so the explain can say how much of a peak is gathered parameters."""

    def __init__(self, tracker: LiveTensorTracker) -> None:
        self.tracker = tracker
        self.sizes: dict[int, int] = {}
        self.live = 0
        self.at_peak = 0
        self._peak = tracker.peak

    def recount(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        key = id(storage)
        self.live += storage.nbytes() - self.sizes.get(key, 0)
        self.sizes[key] = storage.nbytes()

    def watch(self) -> None:
        """After any allocation: if the tracker's peak moved, what was gathered then."""
        if self.tracker.peak > self._peak and not self.tracker._stepping:  # the forward+backward's peak
            self._peak = self.tracker.peak
            self.at_peak = self.live

    def reset(self) -> None:
        self._peak = self.tracker.peak
        self.at_peak = self.live


def trace_fsdp_point(
    spec: ModelSpec,
    knobs: dict[str, Any],
    world_size: int,
    accum: int,
    fsdp: FsdpSettings | None = None,
    label_length: int | None = None,
    lora: LoraSpec | None = None,
    evaluation: dict[str, Any] | None = None,
    padded: bool = False,
    fake: bool = True,
    kernels: str = "cpu",
    trainer: TracedTrainer | None = None,
) -> dict[str, Any]:
    """One FSDP2 config (``knobs``: engine fsdp2) on ``world_size`` ranks, ``accum`` micro-steps a step (the probe's:
    1, or 2 for a config that accumulates); ``fake=False`` runs real tensors (to check the trace against a probe);
    ``kernels="cuda"``: a GPU's kernels where their memory differs (trials.trace_modes.cuda_kernels); ``trainer``: the
    job's training args (their optimizer on the shards, their loss, their eval pile: trials.trace_trainer)."""
    k = Knobs.model_validate({**knobs, "engine": "fsdp2"})
    trainer = trainer or TracedTrainer()
    args = trainer.training_args(k.precision, k.gradient_checkpointing)
    config = ProbeConfig(model=spec, knobs=k, job=JobSettings(lora=lora), fsdp=fsdp, world_size=world_size)
    out: dict[str, Any] = {}
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True) if fake else contextlib.nullcontext()
    masks = masks_decided_as_on_real_tensors(fake and not padded)
    free = trainer.padding_free
    flat = packing_decided_as_on_real_tensors(fake, free, k.max_length)
    with fake_group(world_size), fake_mode, masks, cuda_kernels(kernels == "cuda"), flat:
        from trials.fsdp import FsdpEngine

        torch.manual_seed(0)
        model = build(spec, lora)  # checkpointing is accelerate's fsdp2_apply_ac, applied by FsdpEngine
        prepare_model(model, args)
        head = trainer.trl_head if trainer.dpo is None else None  # SFT's fused LM head (DPO is not traced here)
        fuse(head, model)
        tracker = LiveTensorTracker()
        tracker.track(module_tensors(model))
        gathered = _Gathered(tracker)
        with _watching(tracker, gathered), tracker:
            batch = worst_batch(model, k.micro_batch_size, k.max_length, label_length, padded, free)
            engine = FsdpEngine(model, config, accum, torch.device("cpu"), world_size, args)
            engine.loss = step_loss(head, None, None, engine.loss, args)
            host_offload(engine, tracker)
            for _ in range(accum):  # the first step: the optimizer state
                engine.micro_step(batch)
                host_offload(engine, tracker)
            states = tracker.live - _nbytes(batch)
            shards = sum(tracker.device_bytes(p) for p in engine.module.parameters())
            tracker.reset_peak()
            gathered.reset()
            step = _StepPeak(tracker, engine.optimizer)
            for _ in range(accum):  # one steady cycle: the memory window's peak
                engine.micro_step(batch)
                host_offload(engine, tracker)
            step.remove()
            out.update(
                states_bytes=states,
                param_shard_bytes=shards,
                forward_backward_bytes=max(0, step.outside - states),
                gathered_bytes=gathered.at_peak,
                step_bytes=max(0, step.peak - states),
            )
            forward = their_forward(args, not is_encoder_decoder(model))
            evaluated = (evaluation or {}, label_length, padded, states, (trainer.eval_held_batches, forward), free)
            out.update(_eval_phases(engine, model, k, tracker, *evaluated))
    return out


class _StepPeak:
    """The cycle's peak inside the optimizer step (``peak``) and outside it (``outside``: the forward+backward), by a
    pre/post hook pair on the engine's optimizer (an offloaded step runs paused: its host work is not counted)."""

    def __init__(self, tracker: LiveTensorTracker, optimizer: torch.optim.Optimizer) -> None:
        self.tracker = tracker
        self.peak = 0
        self._before = 0
        self.handles = [optimizer.register_step_pre_hook(self._pre), optimizer.register_step_post_hook(self._post)]

    def _pre(self, *_: Any) -> None:
        self._before = max(self._before, self.tracker.peak)
        self.tracker.reset_peak()

    def _post(self, *_: Any) -> None:
        self.peak = max(self.peak, self.tracker.peak)
        self.tracker.reset_peak()

    @property
    def outside(self) -> int:
        return max(self._before, self.tracker.peak)

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def _eval_phases(
    engine: Any,
    model: Any,
    k: Knobs,
    tracker: LiveTensorTracker,
    evaluation: dict[str, Any],
    label_length: int | None,
    padded: bool,
    states: int,
    held: tuple[int, Any] = (0, None),
    free: PaddingFree | None = None,
) -> dict[str, Any]:
    """The probe's eval forward and (``generate``) a decode of the generation length, on the FSDP2 module after the
    step (grads freed), each a peak above ``states``; nothing when the job does not evaluate; ``free``: padding-free
    batches (trials.data.flattened)."""
    size = evaluation.get("eval_batch_size")
    if size is None:
        return {}
    out: dict[str, Any] = {"eval_batch_size": size}
    module = engine.module
    module.eval()
    batch = worst_batch(model, size, k.max_length, label_length, padded, free)
    tracker.reset_peak()
    with torch.no_grad():
        eval_forward(module, batch, held[0], *([held[1]] if held[1] is not None else []))
    out["eval_bytes"] = max(0, tracker.peak - states)
    if evaluation.get("generate"):
        from trials.decode import traced_decode

        new_tokens = int(evaluation.get("generation_max_length") or label_length or k.max_length)
        beams = int(evaluation.get("num_beams") or 1)
        inputs = {name: v for name, v in batch.items() if name != "labels"}
        tracker.reset_peak()
        peak, cached = traced_decode(module, inputs, new_tokens, beams, tracker)
        out["generate_bytes"] = max(0, peak - states)
        out["generate_cache_bytes"] = cached
        out["generation_length"], out["num_beams"] = new_tokens, beams
    module.train()
    return out


@contextlib.contextmanager
def _watching(tracker: LiveTensorTracker, gathered: _Gathered) -> Iterator[None]:
    """FSDP2's storage resizes recounted by ``gathered`` too, and its at-peak bytes updated after every allocation
    the tracker counts."""
    add = tracker._add

    def counted(*args: Any, **kwargs: Any) -> int:
        delta = add(*args, **kwargs)
        gathered.watch()
        return delta

    resized = tracker.resized

    def recount(t: torch.Tensor) -> None:
        gathered.recount(t)
        resized(t)
        gathered.watch()

    tracker._add = counted  # type: ignore[method-assign]
    tracker.resized = recount  # type: ignore[method-assign]  # the tracker's __enter__ wraps FSDP2's resizes with it
    try:
        yield
    finally:
        tracker._add = add  # type: ignore[method-assign]
        tracker.resized = resized  # type: ignore[method-assign]


def _nbytes(batch: dict[str, torch.Tensor]) -> int:
    return sum(v.untyped_storage().nbytes() for v in batch.values())
