"""The probe config of one configuration: the knobs, the job, and the DeepSpeed JSON (or FSDP2 settings) the user would
run with them.

The DeepSpeed JSON comes from tuner.interop.export.to_deepspeed, the function every export uses, with the user's own
DeepSpeed settings (the baseline's, "auto" resolved from their training args): so trial 0 runs exactly the user's
config and every probe runs the JSON the export hands back (trials.engine.probe_deepspeed_config adapts only how a
probe runs it). Pure: no torch import.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trials.contract import FsdpSettings, Knobs, ProbeConfig
from tuner.interop.export.deepspeed import to_deepspeed


def probe_config(
    *,
    knobs: Knobs,
    baseline: Mapping[str, Any] | None = None,
    training_args: Mapping[str, Any] | None = None,
    fsdp: FsdpSettings | None = None,
    **fields: Any,
) -> ProbeConfig:
    """A ProbeConfig for ``knobs`` (``fields``: the other ProbeConfig fields), its ``deepspeed`` JSON written from
    ``baseline`` (the user's DeepSpeed JSON) and ``training_args`` the way the export writes it; an fsdp2 config
    holds the user's FSDP2 settings ``fsdp`` (what the exports write beside the tuned knobs)."""
    config = ProbeConfig(knobs=knobs, fsdp=fsdp if knobs.engine == "fsdp2" else None, **fields)
    if knobs.engine != "deepspeed":
        return config
    ds = to_deepspeed(
        knobs.model_dump(),
        world_size=config.world_size,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        baseline=baseline,
        allow_auto=True,
        training_args=training_args,
    )
    return config.model_copy(update={"deepspeed": ds})
