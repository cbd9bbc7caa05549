"""The eval phases of a memory trace (trials.estimate): the eval forward and the decode, each a peak above what is
live before its batch; a DPO job's eval runs its loss over the eval pairs (DPOTrainer's prediction_step)."""

from __future__ import annotations

from typing import Any

import torch

from trials.contract_job import PaddingFree
from trials.eval_pile import eval_forward
from trials.memory import LiveTensorTracker
from trials.trace_model import worst_batch
from trials.trace_modes import Mode

TOP = 12  # allocations named per phase: more than the three shown, so a longer config's largest (scaled) is among them


def named(tracker: LiveTensorTracker) -> list[dict[str, Any]]:
    return [{"op": a.op, "shape": list(a.shape), "dtype": a.dtype, "nbytes": a.nbytes} for a in tracker.largest]


def eval_phases(
    model: Any,
    length: int,
    mode: Mode,
    tracker: LiveTensorTracker,
    evaluation: dict[str, Any],
    label_length: int | None,
    padded: bool = False,
    held: tuple[int, Any] = (0, None),
    dpo: tuple[Any, Any] | None = None,
    free: PaddingFree | None = None,
) -> dict[str, Any]:
    """The eval forward (no grad, the eval batch with labels: loss and logits; ``held``: the eval batches whose logits
    their eval loop keeps and their compute_loss, trials.eval_pile) and, with ``generate``, a decode of
    the generation length (trials.decode: every row to the full length), each a peak above what is live before its
    batch (params + optimizer state, no grads). Nothing when the job does not evaluate. ``free``: padding-free eval
    batches (trials.data.flattened)."""
    size = evaluation.get("eval_batch_size")
    if size is None:
        return {"largest": {}}
    out: dict[str, Any] = {"eval_batch_size": size, "largest": {}}
    model.eval()
    before = tracker.live
    batch = worst_batch(model, size * (2 if dpo else 1), length, label_length, padded, free)
    if dpo is not None:  # a DPO job's eval: its loss over the eval pairs (DPOTrainer's prediction_step)
        from trials.dpo import pairs

        batch = pairs(batch, dpo[0])
    tracker.largest_since(TOP)
    tracker.reset_peak()
    with torch.no_grad(), mode.autocast():
        if dpo is not None:
            dpo[1](model, batch)
        else:
            eval_forward(model, batch, held[0], *([held[1]] if held[1] is not None else []))
        # what is still live inside the autocast region: its cache of the weights' low-precision copies (torch keeps
        # a cast of each fp32 leaf that requires grad until the region ends): batch- and length-independent
        cache = max(0, tracker.live - before)
    out["eval_bytes"] = max(0, tracker.peak - before)
    if mode.dtype is not None and not mode.cast_module:
        out["autocast_cache_bytes"] = cache
    out["largest"]["eval_forward"] = named(tracker)
    if evaluation.get("generate") and dpo is None:
        from trials.decode import traced_decode

        new_tokens = int(evaluation.get("generation_max_length") or label_length or length)
        beams = int(evaluation.get("num_beams") or 1)
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        tracker.largest_since(TOP)
        tracker.reset_peak()
        with mode.autocast():
            peak, cached = traced_decode(model, inputs, new_tokens, beams, tracker)
        out["generate_bytes"] = max(0, peak - before)
        out["generate_cache_bytes"] = cached
        out["generation_length"], out["num_beams"] = new_tokens, beams
        out["largest"]["generate"] = named(tracker)
    tracker.keep_largest = 0
    model.train()
    return out
