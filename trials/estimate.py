"""The memory trace: training steps of the model on CPU fake tensors under the live-tensor tracker.

No data is computed (FakeTensorMode): a flan-t5-large-shaped T5 traces in seconds on any machine. For every point
(micro batch, max_length, gradient checkpointing, precision, cast_module) it runs a forward+backward at worst-case
padded shapes in the engine's precision mode (``cast_module``: DeepSpeed's half module with fp32 masters in the
optimizer; else the plain torch engine's autocast over fp32 weights), two AdamW steps on its grads (the first makes
the optimizer state, the second is measured), then one more forward+backward that accumulates into the step's grads,
and reports, in bytes:

- ``activation_bytes``: the first forward+backward's peak above params + full grads (+ optimizer state, resident
  from the second step on: it shifts the peak, not what the forward and backward allocate)
  (activations, saved tensors, temporaries; what every engine adds on top of its model states). The step starts with
  no grads (``zero_grad(set_to_none=True)``), so at its peak few grads exist yet: this undercounts by up to the grads'
  size what a micro-step needs when the grads of earlier micro-steps are resident,
- ``resident_activation_bytes``: the same peak for a gradient-accumulation micro-step, the grads of the earlier
  micro-steps resident (measured on 56 configs of a 3.5M-parameter T5: without it the estimate missed accumulating
  configs by 10-30%, see benchmarks/BENCHMARKS.md),
- ``after_grad_activation_bytes`` / ``resident_after_grad_activation_bytes``: the same two peaks counted from the
  backward's first parameter gradient on (where ZeRO-1/2 allocate their reduce buckets; a causal LM's loss peaks
  before it),
- ``step_temp_bytes``: the optimizer step's temporaries above params + grads + state,
- ``peak_bytes``: the whole step's peak (what the plain torch engine needs).

``python -m trials.estimate --request JSON --out FILE`` writes a ``tuner.memory.estimator.Trace``-shaped JSON to FILE
(exit 3: bad model source). Omits CUDA context, allocator fragmentation, cuBLAS workspace: probes calibrate it."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from trials.contract import LoraSpec, ModelSpec
from trials.memory import LiveTensorTracker
from trials.models import is_encoder_decoder
from trials.outcome import ConfigRefused
from trials.trace_dpo import dpo_batch, dpo_step
from trials.trace_eval import TOP, eval_phases
from trials.trace_eval import named as named_largest
from trials.trace_model import build, worst_batch
from trials.trace_modes import (
    MasterStep,
    Mode,
    cuda_kernels,
    masks_decided_as_on_real_tensors,
    packing_decided_as_on_real_tensors,
)
from trials.trace_trainer import TracedTrainer, optimizer_bytes, optimizer_factory, prepared
from trials.trainer_args import loss_function, their_forward
from trials.trl_head import fuse, step_loss

if TYPE_CHECKING:
    pass


class _FromFirstGrad:
    """The backward's peak from the first parameter gradient on (when a grad is accumulated: the moment DeepSpeed
    ZeRO-1/2's gradient hooks allocate their reduce buckets, ``setup_buckets`` in ``process_gradients``), beside the
    whole micro-step's peak. A causal LM's peak often comes before it: the loss's log-softmax over the vocabulary and
    its backward run before any weight's grad is accumulated."""

    def __init__(self, model: torch.nn.Module, tracker: LiveTensorTracker) -> None:
        self.tracker = tracker
        self.before: int | None = None
        self.handles = [
            p.register_post_accumulate_grad_hook(self._first) for p in model.parameters() if p.requires_grad
        ]

    def _first(self, _param: torch.Tensor) -> None:
        if self.before is None:
            self.before = self.tracker.peak
            self.tracker.reset_peak()

    def peaks(self) -> tuple[int, int]:
        """(the whole micro-step's peak, the peak from the first grad on) in live bytes; detaches the hooks."""
        for h in self.handles:
            h.remove()
        after = self.tracker.peak
        return max(self.before or 0, after), after


def _forward_backward(
    model: torch.nn.Module, batch: dict[str, torch.Tensor], mode: Mode, tracker: LiveTensorTracker, loss_of: Any = None
) -> tuple[int, int]:
    """One micro-step's forward and backward (grads accumulate into whatever ``.grad`` holds); its peak live bytes,
    and the peak from the first parameter grad on (``_FromFirstGrad``). ``loss_of(model, batch)``: the job's loss
    (their Trainer's compute_loss: trials.trainer_args.loss_function); None: the model's own."""
    tracker.reset_peak()
    watch = _FromFirstGrad(model, tracker)
    with mode.autocast():
        loss = loss_of(model, batch) if loss_of is not None else model(**batch).loss
    loss.backward()
    del loss
    return watch.peaks()


def trace_point(
    spec: ModelSpec,
    micro: int,
    length: int,
    checkpointing: bool,
    precision: str,
    fake: bool = True,
    label_length: int | None = None,
    lora: LoraSpec | None = None,
    evaluation: dict[str, Any] | None = None,
    padded: bool = False,
    cast_module: bool = False,
    kernels: str = "cpu",
    trainer: TracedTrainer | None = None,
) -> dict[str, Any]:
    """One point; ``fake=False`` runs the same steps on real tensors (to check the trace against reality). With
    ``lora`` the model carries the job's adapters and AdamW holds the trainable (adapter) params only; with
    ``evaluation`` ({eval_batch_size, generate, generation_max_length, num_beams}) the eval phases too; ``padded``:
    batches with the collator's padding (trials.data.worst_case_batch), as a probe of a job with data runs them;
    ``cast_module``: a bf16/fp16 ``precision`` run as DeepSpeed runs it (the module cast, fp32 masters in the
    optimizer; eval and generate on the cast module), else as the plain torch engine (autocast over fp32 weights);
    ``kernels="cuda"``: a GPU's kernels where their memory differs from the CPU's (trials.trace_modes); ``trainer``:
    the job's training args (trials.trace_trainer: their optimizer, loss, checkpointing keywords, eval pile)."""
    mode = Mode(precision, cast_module)
    trainer = trainer or TracedTrainer()
    args = trainer.training_args(precision, checkpointing)
    fake_mode = FakeTensorMode(allow_non_fake_inputs=False) if fake else contextlib.nullcontext()
    flat = packing_decided_as_on_real_tensors(fake, trainer.padding_free, length)
    with fake_mode, masks_decided_as_on_real_tensors(fake and not padded), cuda_kernels(kernels == "cuda"), flat:
        tracker = LiveTensorTracker()
        with tracker:
            model = build(spec, lora, mode.dtype if mode.cast_module else None)
            prepared(model, args, checkpointing)
            causal = not is_encoder_decoder(model)
            loss_of = loss_function(args, causal) if args is not None else None
            params = list(model.parameters())
            param_count = sum(p.numel() for p in params)
            trainable = [p for p in params if p.requires_grad]
            param_bytes = tracker.live
            largest = max(p.numel() for p in params)
            reference, loss_of = dpo_step(trainer.dpo, spec, mode, loss_of)  # DPO: its reference model and loss
            fuse(trainer.trl_head, model, reference)  # TRL's fused LM head, as the probe runs it (trials.trl_head)
            loss_of = step_loss(trainer.trl_head, trainer.dpo, reference, loss_of, args)
            opt = MasterStep(trainable, mode.cast_module, optimizer_factory(model, trainer.optimizer_args(args)))
            before_batch = tracker.live
            rows = micro * (2 if trainer.dpo else 1)
            batch = dpo_batch(trainer.dpo, worst_batch(model, rows, length, label_length, padded, trainer.padding_free))
            batch_bytes = tracker.live - before_batch
            # the first micro-step (no grads, no optimizer state yet): one forward + backward serves both the
            # activation peaks and the step's grads (the state is resident memory: it shifts the peak, not what
            # the forward and backward allocate)
            tracker.largest_since(TOP)
            fwd_bwd, fwd_bwd_after = _forward_backward(model, batch, mode, tracker, loss_of)
            named = {"forward_backward": named_largest(tracker)}
            first = tracker.live  # params + batch + grads (+ what a model keeps beyond its grads, e.g. a cache)
            opt.step()  # creates the optimizer state: the first step's peak is not what later steps need
            state_bytes = tracker.live - first
            with_grads = tracker.live  # params + state + batch + grads: what every later step starts from
            tracker.largest_since(TOP)
            tracker.reset_peak()
            opt.step()  # the step as every later one runs it: the state resident, the same grads
            step_peak = tracker.peak
            named["optimizer_step"] = named_largest(tracker)
            tracker.keep_largest = 0
            opt.zero_grad(set_to_none=False)  # grads resident, as in the later micro-steps of an accumulation
            resident, resident_after = _forward_backward(model, batch, mode, tracker, loss_of)
            opt.zero_grad(set_to_none=True)  # the Trainer evaluates after the step's zero_grad
            del batch
            held = (trainer.eval_held_batches, their_forward(args, causal))
            dpo = (trainer.dpo, loss_of) if trainer.dpo is not None else None
            shape = (label_length, padded, held, dpo, trainer.padding_free)
            evaluated = eval_phases(model, length, mode, tracker, evaluation or {}, *shape)
            named.update(evaluated.pop("largest"))
    return {
        "param_count": param_count,
        "trainable_count": sum(p.numel() for p in trainable),
        "param_bytes": param_bytes,
        "largest_param": largest,
        **({"reference_count": sum(p.numel() for p in reference.parameters())} if reference is not None else {}),
        "point": {
            "micro_batch_size": micro,
            "max_length": length,
            "gradient_checkpointing": checkpointing,
            "precision": precision,
            "cast_module": mode.cast_module,
            "activation_bytes": max(0, fwd_bwd - first + batch_bytes),
            "resident_activation_bytes": max(0, resident - with_grads + batch_bytes),
            "after_grad_activation_bytes": max(0, fwd_bwd_after - first + batch_bytes),
            "resident_after_grad_activation_bytes": max(0, resident_after - with_grads + batch_bytes),
            "step_temp_bytes": max(0, step_peak - with_grads),
            "peak_bytes": max(fwd_bwd + state_bytes, step_peak),
            **evaluated,
            "largest": named,
        },
    }


def _said(progress: Path | None, index: int) -> None:
    """Tells the parent (tuner.memory.trace_run) which point starts: its index among points + fsdp_points, one line
    appended to ``progress`` (nothing without one)."""
    if progress is not None:
        with progress.open("a") as f:
            f.write(f"{index}\n")


def run(request: dict[str, Any], progress: Path | None = None) -> dict[str, Any]:
    spec = ModelSpec.model_validate(request.get("model") or {})
    lora = LoraSpec.model_validate(request["lora"]) if request.get("lora") else None
    start = time.perf_counter()
    trainer = TracedTrainer.of(request.get("trainer"))
    # "model_wide": false: a part of a request whose first part reports them (tuner.memory.trace_run.split)
    wide = _optimizer_state(spec, lora, trainer) if request.get("model_wide", True) else {}
    out: dict[str, Any] = {"points": [], **wide}
    for index, p in enumerate(request.get("points") or []):
        _said(progress, index)
        got = trace_point(
            spec,
            int(p["micro_batch_size"]),
            int(p["max_length"]),
            bool(p.get("gradient_checkpointing", False)),
            str(p.get("precision", "fp32")),
            label_length=request.get("label_length"),
            lora=lora,
            # "evaluate": false: the train step alone (its eval phases read from a sibling point, as explain asks)
            evaluation=request.get("evaluation") if p.get("evaluate", True) else None,
            padded=bool(request.get("padded")),
            cast_module=bool(p.get("cast_module", False)),
            kernels=str(request.get("kernels") or "cpu"),
            trainer=trainer,
        )
        out.update({k: got[k] for k in ("param_count", "trainable_count", "param_bytes", "largest_param")})
        out.update({k: got[k] for k in ("reference_count",) if k in got})
        out["points"].append(got["point"])
    first = len(request.get("points") or [])
    out["fsdp_points"] = []
    for index, p in enumerate(request.get("fsdp_points") or [], first):
        _said(progress, index)
        out["fsdp_points"].append(_fsdp_point(spec, p, request, lora))
    if "param_count" not in out:  # no point asked: the model stats alone
        with FakeTensorMode():
            params = list(build(spec, lora).parameters())
            out.update(
                param_count=sum(p.numel() for p in params),
                trainable_count=sum(p.numel() for p in params if p.requires_grad),
                param_bytes=sum(p.numel() * 4 for p in params),
                largest_param=max(p.numel() for p in params),
            )
    out["kernels"] = str(request.get("kernels") or "cpu")
    out["pairs"] = trainer.dpo is not None
    given = trainer.args or {}
    out["compiled"] = trainer.compiled or bool(given.get("torch_compile") or given.get("torch_compile_mode"))
    out["trace_s"] = time.perf_counter() - start
    return out


def _optimizer_state(spec: ModelSpec, lora: LoraSpec | None, trainer: TracedTrainer) -> dict[str, Any]:
    """The job's optimizer state (trials.trace_trainer.optimizer_bytes): per parameter and per flat element; nothing
    for the Trainer's default AdamW without training args (the estimate's Adam arithmetic is exact for it)."""
    args = trainer.optimizer_args(trainer.training_args("fp32", False))
    if args is None:
        return {}
    with FakeTensorMode():
        tracker = LiveTensorTracker()
        with tracker:
            model = build(spec, lora)
            per_param, per_element = optimizer_bytes(model, args, tracker)
    return {"optimizer_state_bytes": per_param, "optimizer_flat_bytes": per_element}


def _fsdp_point(spec: ModelSpec, p: dict[str, Any], request: dict[str, Any], lora: LoraSpec | None) -> dict[str, Any]:
    """One FSDP2 point (trials.trace_fsdp): the config's shape and FSDP2 knobs on its world size, accumulating or
    not."""
    from trials.contract import FsdpSettings
    from trials.outcome import ConfigRefused
    from trials.trace_fsdp import trace_fsdp_point

    knobs = {
        "micro_batch_size": int(p["micro_batch_size"]),
        "max_length": int(p["max_length"]),
        "gradient_checkpointing": bool(p.get("gradient_checkpointing", False)),
        "precision": str(p.get("precision", "fp32")),
        "reshard_after_forward": bool(p.get("reshard_after_forward", True)),
        "offload_params": bool(p.get("offload_params", False)),
    }
    world, accumulates = int(p["world_size"]), bool(p.get("accumulates", False))
    held = request.get("fsdp")
    if TracedTrainer.of(request.get("trainer")).dpo is not None:
        said = "the FSDP2 trace of DPO's step (its pairs and reference) is not built yet: such a config is probed"
        return {**knobs, "world_size": world, "accumulates": accumulates, "refused": said}
    try:
        got = trace_fsdp_point(
            spec,
            knobs,
            world,
            2 if accumulates else 1,  # the probe's accumulation: min(real, 2)
            fsdp=FsdpSettings.model_validate(held) if held else None,
            label_length=request.get("label_length"),
            lora=lora,
            evaluation=request.get("evaluation"),
            padded=bool(request.get("padded")),
            kernels=str(request.get("kernels") or "cpu"),
            trainer=TracedTrainer.of(request.get("trainer")),
        )
    except ConfigRefused as refusal:  # e.g. T5's shared parameter: said by the estimate of every FSDP2 config
        got = {"refused": str(refusal)}
    return {**knobs, "world_size": world, "accumulates": accumulates, **got}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trials.estimate", description=__doc__.splitlines()[0])
    ap.add_argument(
        "--request",
        required=True,
        help="JSON: {model: ModelSpec, points: [{micro_batch_size, ...}], label_length, lora: LoraSpec | null}",
    )
    ap.add_argument("--out", required=True, help="file to write the trace JSON to")
    ap.add_argument("--progress", help="file to append the index of each point to as it starts")
    args = ap.parse_args(argv)
    request = json.loads(args.request)
    try:
        result = run(request, Path(args.progress) if args.progress else None)
    except ConfigRefused as exc:  # their arguments name what this host cannot run (trials.trainer_args)
        print(f"refused: {exc}", file=sys.stderr)
        return 4
    except (ValueError, OSError) as exc:  # unknown preset, missing local dir, bad override
        print(f"cannot load model {request.get('model')}: {exc}", file=sys.stderr)
        return 3
    Path(args.out).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
