"""What a probe row means to the Optuna study: its state, user attributes and the "memory" constraint TPE reads.
``tell`` and ``tell_skipped`` are the one place that tells the study about a probe (``retell``: once more, after an
outage, when the first try may have landed)."""

from __future__ import annotations

import optuna
from optuna.trial import TrialState

from tuner.records import ProbeRow, ProbeStatus

OOM_CONSTRAINT = 1.0  # the "memory" constraint of an OOM (> 0 is infeasible for TPE)


def memory_constraint(row: ProbeRow, headroom: float) -> float:
    """> 0: infeasible. An OOM is OOM_CONSTRAINT; a finished probe is its memory need over the headroom, minus 1."""
    if row.status.out_of_memory:
        return OOM_CONSTRAINT
    peak, capacity = row.memory_need, row.capacity
    if peak is None or not capacity:
        return 0.0
    return min(peak / (headroom * capacity) - 1.0, OOM_CONSTRAINT)


def tell(study: optuna.Study, trial: optuna.trial.Trial, row: ProbeRow, headroom: float) -> TrialState:
    """Tells Optuna. The "memory" constraint is set before the state: TPESampler (optuna 5, _split_trials) puts
    every finished trial whose constraints sum above 0 in the infeasible part of the "above" (bad) group, after
    the feasible COMPLETE and PRUNED trials, so OOMs (pruned, +1) and over-headroom peaks (complete, > 0) steer
    the sampler away from that region while stable trials (<= 0) rank by their throughput."""
    trial.set_user_attr("status", row.status.value)
    trial.set_user_attr("cause", row.cause)
    trial.set_user_attr("objective", row.objective)
    trial.set_user_attr("samples_per_s", row.samples_per_s)
    trial.set_user_attr("peak_allocated", row.peak_allocated)
    trial.set_user_attr("capacity", row.capacity)
    trial.set_user_attr("stable", row.stable)
    trial.set_user_attr("knobs", row.knobs)
    trial.set_user_attr("config_key", row.config_key)
    trial.set_user_attr("probe_seconds", row.probe_seconds)
    if row.status.out_of_memory:
        trial.set_constraint("memory", OOM_CONSTRAINT)
        study.tell(trial, state=TrialState.PRUNED)
        return TrialState.PRUNED
    if row.status == ProbeStatus.OK and row.objective is not None:
        trial.set_constraint("memory", memory_constraint(row, headroom))
        study.tell(trial, row.objective)
        return TrialState.COMPLETE
    study.tell(trial, state=TrialState.FAIL)
    return TrialState.FAIL


def retell(study: optuna.Study, trial: optuna.trial.Trial, row: ProbeRow, headroom: float) -> TrialState:
    """``tell`` again after the database went away mid-tell: a trial the first try already finished is left as it
    is (its state returned), a still-running one is told."""
    state = study._storage.get_trial(trial._trial_id).state
    if state.is_finished():
        return state
    return tell(study, trial, row, headroom)


def tell_skipped(study: optuna.Study, trial: optuna.trial.Trial, cause: str) -> None:
    """A trial that will not be probed (another worker has the config): FAIL with its cause."""
    trial.set_user_attr("status", "skipped")
    trial.set_user_attr("cause", cause)
    study.tell(trial, state=TrialState.FAIL)


__all__ = ["OOM_CONSTRAINT", "memory_constraint", "retell", "tell", "tell_skipped"]
