"""Pins of the Optuna behaviours tuner.search.study relies on through Optuna's private attributes (the one module that
uses them): an Optuna upgrade that changes one fails here, by name, instead of in a search. Each runs on the in-memory
storage the replay uses and on the RDB storage (SQLite here) the driver uses."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import optuna
import pytest
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import TrialState

from trials.contract import Knobs
from tuner.job.space import config_key, space_from_dict
from tuner.records import Fidelity, ProbeRow, ProbeStatus
from tuner.search.sampling import fixed_params, make_sampler
from tuner.search.study import (
    SearchStudy,
    create_running_trial,
    current_state,
    retell,
    set_user_attr,
    storage_of,
    tell,
    trial_id,
)
from tuner.storage import optuna_storage

optuna.logging.set_verbosity(optuna.logging.WARNING)


class CountingSampler(optuna.samplers.RandomSampler):
    """Counts ``before_trial``: what building an ``optuna.trial.Trial`` runs, and what set_user_attr avoids."""

    def __init__(self) -> None:
        super().__init__(seed=0)
        self.before = 0

    def before_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        self.before += 1
        super().before_trial(study, trial)


@pytest.fixture(params=["memory", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str | None:
    return None if request.param == "memory" else f"sqlite:///{tmp_path / 'pins.db'}"


def study_on(url: str | None, sampler: optuna.samplers.BaseSampler | None = None) -> optuna.Study:
    storage = optuna_storage(url, None, None) if url is not None else optuna.storages.InMemoryStorage()
    return optuna.create_study(study_name="pins", storage=storage, direction="maximize", sampler=sampler)


def other_worker(study: optuna.Study, url: str | None) -> optuna.Study:
    """The same study through another Study object (another worker's; SQLite: its own storage and connection)."""
    storage = optuna_storage(url, None, None) if url is not None else storage_of(study)
    return optuna.load_study(study_name="pins", storage=storage)


def test_trial_id_is_the_storage_id_of_a_live_and_of_a_frozen_trial(url: str | None) -> None:
    study = study_on(url)
    study.ask()  # ids and numbers may differ per storage: read both back through the id
    live = study.ask()
    (frozen,) = [t for t in study.get_trials(deepcopy=False) if t.number == live.number]
    assert trial_id(live) == trial_id(frozen)
    assert storage_of(study).get_trial(trial_id(live)).number == live.number == 1


def test_storage_of_is_the_studys_storage_and_takes_a_heartbeat(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'beat.db'}"
    storage = optuna_storage(url)  # with a heartbeat interval, as the driver's
    study = optuna.create_study(study_name="beat", storage=storage, direction="maximize")
    trial = study.ask()
    # the study wraps the RDB storage (optuna's _CachedStorage): the heartbeat must still land in the database
    storage_of(study).record_heartbeat(trial_id(trial))  # what the driver's heartbeat thread calls
    with sqlite3.connect(tmp_path / "beat.db") as db:
        assert db.execute("SELECT trial_id FROM trial_heartbeats").fetchall() == [(trial_id(trial),)]


def test_create_running_trial_makes_a_running_trial_with_the_fixed_params_and_user_attrs(url: str | None) -> None:
    study = study_on(url, make_sampler(0))
    trial = create_running_trial(study, {"micro_batch_size": 4}, {"worker": "host:1"})
    (frozen,) = study.get_trials(deepcopy=False)
    assert frozen.state == TrialState.RUNNING and frozen.number == trial.number == 0
    assert frozen.system_attrs["fixed_params"] == {"micro_batch_size": 4}
    assert frozen.user_attrs == {"worker": "host:1"}
    # the sampler (TPE here) hands back the fixed value: how Space.sample reads the knobs a proposer chose
    assert trial.suggest_categorical("micro_batch_size", [1, 2, 4, 8]) == 4
    assert study.get_trials(deepcopy=False)[0].params == {"micro_batch_size": 4}
    assert not study.get_trials(states=(TrialState.WAITING,)), "nothing went through the shared WAITING queue"


def test_the_cache_reset_makes_the_next_cached_read_see_the_new_trial(url: str | None) -> None:
    study = study_on(url)
    study.ask()
    assert len(study._get_trials(deepcopy=False, use_cache=True)) == 1  # a sampler's read fills the cache
    # without the reset (a bare create_new_trial), the cached read a sampler makes misses the new trial ...
    storage_of(study).create_new_trial(study._study_id)
    assert len(study._get_trials(deepcopy=False, use_cache=True)) == 1
    # ... with it, the read sees every trial (TPE's constant liar counts the RUNNING ones)
    create_running_trial(study, {"micro_batch_size": 2}, {})
    cached = study._get_trials(deepcopy=False, use_cache=True)
    assert [t.state for t in cached] == [TrialState.RUNNING] * 3


def test_set_user_attr_reaches_the_storage_without_building_a_trial_where_the_public_ways_cannot(
    url: str | None,
) -> None:
    sampler = CountingSampler()
    study = study_on(url, sampler)
    study.ask()
    (frozen,) = other_worker(study, url).get_trials(states=(TrialState.RUNNING,))
    frozen.set_user_attr("status", "public")  # FrozenTrial's own setter only changes this copy
    assert "status" not in study.get_trials(deepcopy=False)[0].user_attrs
    before = sampler.before
    set_user_attr(study, frozen, "status", "interrupted")
    assert study.get_trials(deepcopy=False)[0].user_attrs["status"] == "interrupted"
    assert sampler.before == before, "no sampler hook ran"
    optuna.trial.Trial(study, trial_id(frozen))  # the public alternative: a Trial, whose constructor runs the hook
    assert sampler.before == before + 1


def test_a_finished_trial_refuses_a_user_attr_on_both_paths(url: str | None) -> None:
    study = study_on(url)
    trial = study.ask()
    study.tell(trial, state=TrialState.FAIL)
    (frozen,) = study.get_trials(deepcopy=False)
    with pytest.raises(UpdateFinishedTrialError):
        set_user_attr(study, frozen, "status", "interrupted")  # a reap racing the owner's tell fails loudly
    with pytest.raises(UpdateFinishedTrialError):
        trial.set_user_attr("status", "interrupted")


def test_current_state_reads_past_the_cache_what_another_worker_told(url: str | None) -> None:
    study = study_on(url)
    trial = study.ask()
    study._get_trials(deepcopy=False, use_cache=True)  # cached while the trial was running
    other = other_worker(study, url)
    other.tell(trial.number, 1.0)
    assert current_state(study, trial) == TrialState.COMPLETE
    oom = ProbeRow(config_key="k", fidelity=Fidelity.SHORT, status=ProbeStatus.OOM, knobs={}, config={})
    assert retell(study, trial, oom, 0.9) == TrialState.COMPLETE  # already finished: left as it is, not PRUNED
    assert study.get_trials(deepcopy=False)[0].value == 1.0


def test_search_study_asks_tagged_trials_and_tells_rows(url: str | None) -> None:
    space = space_from_dict({"micro_batch_size": [1, 2, 4], "max_length": [64]})

    def key(k: Knobs) -> str:
        return config_key(k, 1, 1)

    trials = SearchStudy(study_on(url, make_sampler(0)), "host:1", 0.9, space, key)
    pick = Knobs(micro_batch_size=4, max_length=64)
    trial, knobs, found = trials.ask_short(pick)
    assert knobs == pick and found == key(pick)
    frozen = trials.study.get_trials(deepcopy=False)[0]
    assert frozen.system_attrs["fixed_params"] == fixed_params(pick)
    tags = {"worker": "host:1", "fidelity": "short", "knobs": pick.model_dump(), "config_key": found}
    assert frozen.user_attrs == tags
    oom = ProbeRow(found, Fidelity.SHORT, ProbeStatus.OOM, knobs=pick.model_dump(), config={})
    assert tell(trials.study, trial, oom, 0.9) == TrialState.PRUNED
    assert trials.study.get_trials(deepcopy=False)[0].constraints == {"memory": 1.0}
    sampled, _, _ = trials.ask_short()  # no pick: the sampler's, still this worker's
    assert sampled.user_attrs["worker"] == "host:1" and sampled.number == 1
