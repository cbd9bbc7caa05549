"""Several workers on one study (issue 13, point 9): a worker that loses the baseline's claim explores meanwhile
instead of creating and failing trials in a loop, and a config a worker chose is created as its own trial in one
INSERT, never through Optuna's WAITING queue that every worker of the study pops from. Real SQLite, real probes."""

from __future__ import annotations

from pathlib import Path

import optuna
from optuna.trial import TrialState

from trials.contract import Knobs, ModelSpec
from tuner.job.batching import accumulation_steps
from tuner.job.objective import objective_for
from tuner.job.space import config_key, space_from_dict
from tuner.probing.runner import run_probe
from tuner.records import Fidelity
from tuner.search.request import SearchRequest
from tuner.search.sampling import fixed_params
from tuner.search.schedule import Schedule
from tuner.search.strategy import SearchSetup, Strategy
from tuner.session.recovery import open_study
from tuner.session.session import open_search

optuna.logging.set_verbosity(optuna.logging.WARNING)
SPACE = {
    "micro_batch_size": [1, 2],
    "max_length": [16],
    "engine": ["torch"],
    "zero_stage": [0],
    "gradient_checkpointing": [False, True],
}


def _request(url: str, name: str, **extra) -> SearchRequest:
    space = space_from_dict(SPACE)
    return SearchRequest(
        study_name=name,
        storage=url,
        model=ModelSpec(),
        space=space,
        world_size=1,
        global_batch=2,
        objective=objective_for([16]),
        budget_s=120,
        device_memory=1 << 30,
        schedule=Schedule(finalists=0),
        seed=1,
        **extra,
    )


def test_losing_the_baseline_claim_does_not_spin_creating_trials(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'w.db'}"
    baseline = Knobs(micro_batch_size=1, max_length=16, engine="torch")
    search = open_search(_request(url, "base", baseline=baseline, n_trials=2), run_probe)
    # another live worker is probing the baseline (its run beats; it never finishes within this test)
    key = config_key(baseline, 1, accumulation_steps(2, 1, 1) or 1)
    search.store.start_run("base", "host-b:2", 600.0, None)
    assert search.store.claim("base", key, Fidelity.BASELINE.value, 0, "host-b:2")

    summary = search.run()
    trials = search.study.get_trials(deepcopy=False)
    skipped = [t for t in trials if t.user_attrs.get("status") == "skipped"]
    assert len(skipped) <= 1, f"{len(skipped)} junk trials created while another worker probed the baseline"
    assert summary.stop_reason == "2 trials done", summary.stop_reason
    assert [r.fidelity for r in search.store.probes("base")] == [Fidelity.SHORT, Fidelity.SHORT]
    assert search.store.claim_owner("base", key, Fidelity.BASELINE.value) == "host-b:2"


def test_a_chosen_config_is_this_workers_own_trial_not_the_shared_queues(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    request = _request(url, "queue")
    study = open_study("queue", url, 1)
    # another worker's config (checkpointed: the opening starts at the plainest) waits in the study's queue
    theirs = Knobs(micro_batch_size=1, max_length=16, engine="torch", gradient_checkpointing=True)
    study.enqueue_trial(fixed_params(theirs), skip_if_exists=False)
    (their_trial,) = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    mine = Strategy(study, SearchSetup.of(request), worker="host-a:1")
    proposal = mine.propose(100.0)
    assert proposal is not None and proposal.trial is not None
    assert not proposal.config.knobs.gradient_checkpointing
    (still,) = [t for t in study.get_trials(deepcopy=False) if t.number == their_trial.number]
    assert still.state == TrialState.WAITING, "it took the other's config"
    assert proposal.trial.user_attrs["worker"] == "host-a:1"
    assert proposal.config.knobs == Knobs.model_validate(proposal.trial.user_attrs["knobs"])
