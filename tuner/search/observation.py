"""What a probe's result becomes: its row (tuner.records.ProbeRow), and the row of a config ruled out without
running. Pure builders; the strategy calls them and the driver stores what they build."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trials.contract import ProbeConfig, ProbeResult
from tuner.job.objective import Objective
from tuner.memory.frontier import describe
from tuner.records.probe import Fidelity, ProbeRow, ProbeStatus, is_stable
from tuner.records.ruled_out import RuledOutBy

if TYPE_CHECKING:
    from tuner.search.evidence import Inference


def probe_row(
    config: ProbeConfig,
    result: ProbeResult,
    *,
    trial_number: int | None,
    fidelity: Fidelity,
    config_key: str,
    estimate_bytes: int | None,
    objective: Objective,
    device_memory: int | None,
    headroom: float,
) -> ProbeRow:
    """The row of a finished probe: status, throughput and objective, peaks, whether it is stable, the whole result."""
    knobs = config.knobs
    capacity = result.capacity or device_memory
    return ProbeRow(
        trial_number=trial_number,
        fidelity=Fidelity(fidelity),
        config_key=config_key,
        knobs=knobs.model_dump(mode="json"),
        config=config.model_dump(mode="json"),
        status=ProbeStatus(result.status),
        cause=result.cause,
        samples_per_s=result.samples_per_s,
        tokens_per_s=result.tokens_per_s,
        objective=objective.of(result, knobs.max_length),
        peak_allocated=result.peak_allocated,
        peak_reserved=result.peak_reserved,
        capacity=capacity,
        alloc_retries=result.alloc_retries,
        stable=is_stable(result.status, result.memory_need, capacity, headroom, result.alloc_retries),
        estimate_bytes=estimate_bytes,
        probe_seconds=result.wall_s,
        setup_s=result.setup_s,
        result=result.model_dump(mode="json"),
    )


def inferred_row(
    trial_number: int,
    config: ProbeConfig,
    config_key: str,
    inference: Inference,
    capacity: int | None,
) -> ProbeRow:
    """The row of a config the frontier or the memory estimate says must OOM (``inference``, verdict "oom"):
    recorded, never run; its cause in words, what ruled it out as data."""
    cause, estimate = inference.cause, inference.estimate
    ruled_out_by = inference.ruled_out_by or RuledOutBy.from_cause(cause, estimate)
    return ProbeRow(
        trial_number=trial_number,
        fidelity=Fidelity.INFERRED,
        config_key=config_key,
        knobs=config.knobs.model_dump(mode="json"),
        config=config.model_dump(mode="json"),
        status=ProbeStatus.INFERRED_OOM,
        cause=cause or f"inferred-oom: {describe(config.knobs.model_dump())}",
        stable=False,
        estimate_bytes=estimate,
        capacity=capacity,
        ruled_out_by=ruled_out_by,
    )


__all__ = ["inferred_row", "probe_row"]
