"""When the user's job evaluates, as their Trainer and script decide it from their training args. Pure.

TrainingArguments' ``eval_strategy`` defaults to "no": a file that sets neither it nor ``do_eval`` never evaluates
during training (transformers 4.57 / 5.x: ``do_eval`` becomes true when the strategy is not "no"). ``do_eval`` /
``do_predict`` alone are their script's evaluate() / predict() after training (transformers' example scripts), run
with the optimizer state still resident: the same phase for the probe. What evaluation keeps on the device: with
``prediction_loss_only`` nothing; with ``predict_with_generate`` the generated ids (small); else the logits of each eval
batch, concatenated on the device until ``eval_accumulation_steps`` batches moved them to the host (unset: until the
end of evaluation) when their script computes metrics.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

NO = "no"


def evaluates(given: Mapping[str, Any]) -> bool:
    """Whether a job with these training args runs an eval phase: a strategy other than "no", or their script's
    do_eval / do_predict."""
    strategy = str(given.get("eval_strategy") or NO).lower()
    return strategy != NO or bool(given.get("do_eval")) or bool(given.get("do_predict"))


def held_eval_batches(given: Mapping[str, Any]) -> int:
    """How many eval batches' logits the probe keeps on the device: none with prediction_loss_only or
    predict_with_generate, eval_accumulation_steps when set, else one (the pile's first batch: see ``pile_line``)."""
    if not evaluates(given) or given.get("prediction_loss_only") or given.get("predict_with_generate"):
        return 0
    steps = given.get("eval_accumulation_steps")
    if isinstance(steps, int) and not isinstance(steps, bool) and steps >= 1:
        return steps
    return 1


def pile_line(given: Mapping[str, Any]) -> str | None:
    """What the job line says of the eval outputs their Trainer keeps on the device (None: nothing to say)."""
    held = held_eval_batches(given)
    if held == 0:
        return None
    if given.get("eval_accumulation_steps"):
        return f"eval logits of {held} batches held on the device (eval_accumulation_steps), as your Trainer holds them"
    return (
        "eval logits: with a compute_metrics your Trainer keeps every eval batch's logits on the device until the end "
        "of evaluation (no eval_accumulation_steps); the probe holds one batch's: set eval_accumulation_steps to "
        "bound the pile"
    )


def strategy_line(given: Mapping[str, Any] | None) -> str:
    """Where the job's evaluation comes from, in a few words."""
    if given is None:
        return "no training args"
    strategy = given.get("eval_strategy")
    if strategy is not None and str(strategy).lower() != NO:
        steps = given.get("eval_steps")
        return f"eval_strategy {strategy}" + (f" every {steps} steps" if steps and strategy == "steps" else "")
    if given.get("do_eval") or given.get("do_predict"):
        return "do_eval" if given.get("do_eval") else "do_predict"
    return 'eval_strategy "no" (TrainingArguments\' default)' if strategy is None else 'eval_strategy "no"'
