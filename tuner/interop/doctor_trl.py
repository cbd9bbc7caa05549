"""`tuner doctor`'s checks of a TRL recipe (tuner.job.ledger.trl reads it as TRL does): the traps of TRL's own
trainers, each with its number from the one estimate where the estimate has the part. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tuner.interop.doctor_cost import Basis, Cost, size
from tuner.interop.doctor_finding import Finding
from tuner.job.ledger.trl import read_recipe
from tuner.memory.breakdown import REFERENCE

PRECOMPUTE = (
    "precompute_ref_log_probs: true: DPOTrainer computes the reference log-probs once, before training, and keeps no "
    "reference model during it (dpo_trainer.py: `self.ref_model = None`); not with sync_ref_model or an iterable "
    "dataset, and only where your script passes no ref_model of its own"
)


def _reference_cost(basis: Basis) -> Cost | None:
    """The estimate's reference-model part on one rank (the same in every phase). None: it has none."""
    phase = basis.estimator.breakdown(basis.knobs).worst.largest_part(REFERENCE)
    if phase is None or not phase.part(REFERENCE):
        return None
    held = phase.part(REFERENCE)
    return Cost(
        nbytes=held,
        number=f"reference model {size(held)} per rank in every phase (tuner estimate's 'reference model' row), "
        f"and its no-grad forward of the pairs inside each step; with precompute_ref_log_probs: none in the step",
        not_covered="the one pass before training that precomputes the log-probs (at precompute_ref_batch_size)",
    )


def trl_findings(hf: Mapping[str, Any], basis: Basis | None) -> list[Finding]:
    """The TRL traps of the recipe ``hf`` (none for a plain training-args file)."""
    try:
        recipe = read_recipe(hf)
    except ValueError:  # both kinds' keys: the ledger's refusal says it
        return []
    found: list[Finding] = []
    if recipe.kind == "dpo" and recipe.reference == "model" and not hf.get("sync_ref_model"):
        cost = _reference_cost(basis) if basis is not None else None
        found.append(
            Finding(
                code="dpo-reference-model",
                severity="warn",
                title="a DPO recipe holds a frozen reference model for the whole run (no PEFT, nothing precomputed)",
                why="DPOTrainer keeps a second copy of the model on every rank and runs its forward on every "
                "micro-batch's pairs",
                fix=PRECOMPUTE,
                search="set precompute_ref_log_probs: true in the recipe: tuner search then probes the step without "
                "the reference (it is your job's setting, not a knob it varies)",
                nbytes=cost.nbytes if cost else None,
                number=cost.number if cost else "no number without --model: the estimate needs the model",
                not_covered=cost.not_covered if cost else "",
            )
        )
    return found
