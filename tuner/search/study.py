"""The one adapter between the search and Optuna: asking trials, telling them what a probe row means (state, user
attributes, the "memory" constraint TPE reads), and the few storage-level operations Optuna has no public call for.

Every use of an Optuna private attribute in tuner is in this module (``_storage``, ``_study_id``, ``_trial_id``,
``_thread_local``); tests/tuner/search/test_study.py pins each Optuna behaviour they rely on, so an Optuna upgrade that
changes one fails there, not in a search. ``tell`` and ``tell_skipped`` are the one place that tells the study about a
probe (``retell``: once more, after an outage, when the first try may have landed).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optuna
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, TrialState, create_trial

from trials.contract import Knobs
from tuner.job.space import Space
from tuner.records import Fidelity, ProbeRow, ProbeStatus
from tuner.search.sampling import fixed_params

OOM_CONSTRAINT = 1.0  # the "memory" constraint of an OOM (> 0 is infeasible for TPE)


# -- the private accesses (pinned by tests/tuner/search/test_study.py) -------------------------------------------------
def trial_id(trial: optuna.trial.Trial | FrozenTrial) -> int:
    """The storage's id of a trial (Optuna keeps it private on both; the number is per study, the id per storage)."""
    return trial._trial_id


def storage_of(study: optuna.Study) -> BaseStorage:
    """The study's storage (e.g. for ``record_heartbeat``, which Optuna only calls inside ``Study.optimize``)."""
    return study._storage


def create_running_trial(study: optuna.Study, fixed: dict[str, Any], user_attrs: dict[str, Any]) -> optuna.trial.Trial:
    """A new RUNNING trial whose ``fixed`` params the sampler's suggest returns (Optuna's "fixed_params" system
    attribute, as ``enqueue_trial`` sets), created in one INSERT. Not through ``enqueue_trial`` + ``ask``: the WAITING
    queue is shared by every worker of the study, so another worker's ask could pop the config this one chose."""
    template = create_trial(state=TrialState.RUNNING, system_attrs={"fixed_params": fixed}, user_attrs=user_attrs)
    new_id = study._storage.create_new_trial(study._study_id, template_trial=template)
    study._thread_local.cached_all_trials = None  # as Study.ask does: the next read of the trials sees the new one
    return optuna.trial.Trial(study, new_id)


def set_user_attr(study: optuna.Study, trial: FrozenTrial, key: str, value: Any) -> None:
    """A user attribute on a RUNNING trial known only as a FrozenTrial (e.g. another worker's, from ``get_trials``),
    without building an ``optuna.trial.Trial`` (whose constructor runs the sampler's ``before_trial``)."""
    study._storage.set_trial_user_attr(trial._trial_id, key, value)


def current_state(study: optuna.Study, trial: optuna.trial.Trial) -> TrialState:
    """The trial's state in the storage now (``Trial`` has no public state; ``get_trials`` may read a cache)."""
    return study._storage.get_trial(trial._trial_id).state


# -- telling -----------------------------------------------------------------------------------------------------------
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
    state = current_state(study, trial)
    if state.is_finished():
        return state
    return tell(study, trial, row, headroom)


def tell_skipped(study: optuna.Study, trial: optuna.trial.Trial, cause: str) -> None:
    """A trial that will not be probed (another worker has the config): FAIL with its cause."""
    trial.set_user_attr("status", ProbeStatus.SKIPPED.value)
    trial.set_user_attr("cause", cause)
    study.tell(trial, state=TrialState.FAIL)


class SearchStudy:
    """One worker's view of the study for the strategy: trials asked (tagged with the worker, so a resume can fail the
    trials of a dead one) and told from probe rows."""

    def __init__(
        self, study: optuna.Study, worker: str | None, headroom: float, space: Space, key: Callable[[Knobs], str]
    ) -> None:
        self.study, self.worker, self.headroom = study, worker, headroom
        self.space, self.key = space, key  # the knobs a trial suggests, and their config key

    def ask(self, fixed: dict[str, Any] | None = None) -> optuna.trial.Trial:
        """A new RUNNING trial of this worker: the sampler's (TPE), or with the ``fixed`` params."""
        if fixed is not None:
            return create_running_trial(self.study, fixed, {"worker": self.worker} if self.worker is not None else {})
        trial = self.study.ask()
        if self.worker is not None:
            trial.set_user_attr("worker", self.worker)
        return trial

    def ask_short(self, pick: Knobs | None = None) -> tuple[optuna.trial.Trial, Knobs, str]:
        """A short-fidelity trial of the knobs ``pick``, else of the sampler's; tagged with its knobs and config key."""
        trial = self.ask(fixed_params(pick) if pick is not None else None)
        knobs = self.space.sample(trial)
        config_key = self.key(knobs)
        trial.set_user_attr("fidelity", Fidelity.SHORT.value)
        trial.set_user_attr("knobs", knobs.model_dump(mode="json"))
        trial.set_user_attr("config_key", config_key)
        return trial, knobs, config_key

    def tell(self, trial: optuna.trial.Trial, row: ProbeRow) -> TrialState:
        return tell(self.study, trial, row, self.headroom)

    def tell_reused(self, trial: optuna.trial.Trial, row: ProbeRow) -> TrialState:
        """The config was measured before (``row``): the trial is told that measurement, and where it came from."""
        trial.set_user_attr("reused_from", row.trial_number)
        return self.tell(trial, row)

    def skip(self, trial: optuna.trial.Trial, cause: str = "being probed by another worker") -> None:
        tell_skipped(self.study, trial, cause)


__all__ = [
    "OOM_CONSTRAINT",
    "SearchStudy",
    "create_running_trial",
    "current_state",
    "memory_constraint",
    "retell",
    "set_user_attr",
    "storage_of",
    "tell",
    "tell_skipped",
    "trial_id",
]
