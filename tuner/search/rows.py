"""What a probe means twice over: as a stored row (the shape of tuner_probes rows, which selection, the frontier and the
guide read) and as an Optuna trial (state, user attributes and the "memory" constraint TPE reads). The row builders are
pure; ``tell`` and ``tell_skipped`` are the one place that tells the study."""

from __future__ import annotations

from typing import Any

import optuna
from optuna.trial import TrialState

from trials.contract import ProbeConfig, ProbeResult
from tuner.job.objective import Objective
from tuner.memory.frontier import describe
from tuner.search.selection import is_stable

OOM_CONSTRAINT = 1.0  # the "memory" constraint of an OOM (> 0 is infeasible for TPE)
_ATTRS = ("status", "cause", "objective", "samples_per_s", "peak_allocated", "capacity", "stable")


def probe_row(
    config: ProbeConfig,
    result: ProbeResult,
    *,
    trial_number: int | None,
    fidelity: str,
    config_key: str,
    estimate_bytes: int | None,
    objective: Objective,
    device_memory: int | None,
    headroom: float,
) -> dict[str, Any]:
    """The row of a finished probe: status, throughput and objective, peaks, whether it is stable, the whole result."""
    knobs = config.knobs
    capacity = result.capacity or device_memory
    return {
        "trial_number": trial_number,
        "fidelity": fidelity,
        "config_key": config_key,
        "knobs": knobs.model_dump(mode="json"),
        "config": config.model_dump(mode="json"),
        "status": result.status,
        "cause": result.cause,
        "samples_per_s": result.samples_per_s,
        "tokens_per_s": result.tokens_per_s,
        "objective": objective.of(result, knobs.max_length),
        "peak_allocated": result.peak_allocated,
        "peak_reserved": result.peak_reserved,
        "capacity": capacity,
        "alloc_retries": result.alloc_retries,
        "stable": is_stable(result.status, result.peak_allocated, capacity, headroom, result.alloc_retries),
        "estimate_bytes": estimate_bytes,
        "probe_seconds": result.wall_s,
        "setup_s": result.setup_s,
        "result": result.model_dump(mode="json"),
    }


def inferred_row(
    trial_number: int,
    config: ProbeConfig,
    config_key: str,
    cause: str | None,
    estimate: int | None,
    capacity: int | None,
) -> dict[str, Any]:
    """The row of a config the frontier or the memory estimate says must OOM: recorded, never run."""
    return {
        "trial_number": trial_number,
        "fidelity": "inferred",
        "config_key": config_key,
        "knobs": config.knobs.model_dump(mode="json"),
        "config": config.model_dump(mode="json"),
        "status": "inferred-oom",
        "cause": cause or f"inferred-oom: {describe(config.knobs.model_dump())}",
        "stable": False,
        "estimate_bytes": estimate,
        "capacity": capacity,
    }


def memory_constraint(row: dict[str, Any], headroom: float) -> float:
    """> 0: infeasible. An OOM is OOM_CONSTRAINT; a finished probe is its peak over the headroom line, minus 1."""
    if row["status"] == "oom" or str(row["status"]).startswith("inferred"):
        return OOM_CONSTRAINT
    peak, capacity = row.get("peak_allocated"), row.get("capacity")
    if peak is None or not capacity:
        return 0.0
    return min(peak / (headroom * capacity) - 1.0, OOM_CONSTRAINT)


def tell(study: optuna.Study, trial: optuna.trial.Trial, row: dict[str, Any], headroom: float) -> TrialState:
    """Tells Optuna. The "memory" constraint is set before the state: TPESampler (optuna 5, _split_trials) puts
    every finished trial whose constraints sum above 0 in the infeasible part of the "above" (bad) group, after
    the feasible COMPLETE and PRUNED trials, so OOMs (pruned, +1) and over-headroom peaks (complete, > 0) steer
    the sampler away from that region while stable trials (<= 0) rank by their throughput."""
    for name in _ATTRS:
        trial.set_user_attr(name, row.get(name))
    trial.set_user_attr("knobs", row["knobs"])
    trial.set_user_attr("config_key", row["config_key"])
    trial.set_user_attr("probe_seconds", row.get("probe_seconds"))
    status = row["status"]
    if status in ("oom", "inferred-oom"):
        trial.set_constraint("memory", OOM_CONSTRAINT)
        study.tell(trial, state=TrialState.PRUNED)
        return TrialState.PRUNED
    if status == "ok" and row.get("objective") is not None:
        trial.set_constraint("memory", memory_constraint(row, headroom))
        study.tell(trial, row["objective"])
        return TrialState.COMPLETE
    study.tell(trial, state=TrialState.FAIL)
    return TrialState.FAIL


def tell_skipped(study: optuna.Study, trial: optuna.trial.Trial, cause: str) -> None:
    """A trial that will not be probed (another worker has the config): FAIL with its cause."""
    trial.set_user_attr("status", "skipped")
    trial.set_user_attr("cause", cause)
    study.tell(trial, state=TrialState.FAIL)


__all__ = ["OOM_CONSTRAINT", "inferred_row", "memory_constraint", "probe_row", "tell", "tell_skipped"]
