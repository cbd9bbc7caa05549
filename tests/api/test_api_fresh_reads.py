"""Cached reads are never stale (issue 13, "reads that scale"): every change a worker makes to a study (a probe row, a
trial that finishes, a new trial, an attribute on a running trial) shows on the next read of every endpoint, on
SQLite and PostgreSQL; and the incremental trial counts (tuner.storage.trial_counts) agree with a full count."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optuna
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from optuna.trial import TrialState

from api.app import create_app
from tests.helpers.sample_storage import DIST, SampleStudy, populate
from tuner.settings import Settings
from tuner.storage import Store, optuna_storage
from tuner.storage.optuna_trials import TRIALS
from tuner.storage.trial_counts import Tally, TrialCounts, fold

STUDY = "live"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def url(request: pytest.FixtureRequest, tmp_path, new_postgres_url: Callable[[], str]) -> str:
    out = f"sqlite:///{tmp_path / 'tuner.db'}" if request.param == "sqlite" else new_postgres_url()
    populate(out, STUDY)  # trials 0-6 finished, trial 7 RUNNING
    return out


def _get(client: TestClient, path: str, **params: Any) -> dict[str, Any]:
    r = client.get(path, params=params)
    assert r.status_code == 200, r.text
    return r.json()


def _page(client: TestClient, **params: Any) -> dict[str, Any]:
    return _get(client, f"/studies/{STUDY}/trials", **params)


def _extra_probe(store: Store, trial: int) -> int:
    first = store.probes_of_trials(STUDY, [trial])[0]
    return SampleStudy(store.url, STUDY).again(first, fidelity="confirm").id or 0


def test_each_change_shows_on_the_next_read(url: str) -> None:
    client = TestClient(create_app(Settings(storage=url)))
    store = Store(url)
    study = optuna.load_study(study_name=STUDY, storage=optuna_storage(url, None, None))
    for _ in range(2):  # the second read is served from the caches
        head, detail = _page(client, limit=3), _get(client, f"/studies/{STUDY}")
        pruned, everything = _page(client, state="PRUNED"), _page(client)
    assert len(head["trials"]) == 3 and "RUNNING" not in {t["state"] for t in head["trials"]}
    assert detail["trial_states"]["RUNNING"] == 1 and everything["total"] == 8

    # a probe row on a finished trial of a cached page
    before = len(head["trials"][1]["probes"])
    new_id = _extra_probe(store, 1)
    head = _page(client, limit=3)
    assert [p["id"] for p in head["trials"][1]["probes"]][-1] == new_id and len(
        head["trials"][1]["probes"]
    ) == before + 1
    assert (
        sum(_get(client, f"/studies/{STUDY}")["probe_statuses"].values()) == sum(detail["probe_statuses"].values()) + 1
    )

    # the running trial is pruned: the counts, the filtered page and the full page all see it
    study.tell(7, state=TrialState.PRUNED)
    detail = _get(client, f"/studies/{STUDY}")
    assert "RUNNING" not in detail["trial_states"]
    assert detail["trial_states"]["PRUNED"] == pruned["total"] + 1
    now_pruned = _page(client, state="PRUNED")
    assert now_pruned["total"] == pruned["total"] + 1 and now_pruned["trials"][-1]["number"] == 7
    assert _page(client)["trials"][7]["state"] == "PRUNED"

    # a new trial; then an attribute set on it while it runs
    trial = study.ask(DIST)
    listed = _page(client)
    assert listed["total"] == 9 and listed["trials"][-1]["state"] == "RUNNING"
    assert listed["trials"][-1]["cause"] is None
    trial.set_user_attr("cause", "being probed by another worker")
    assert _page(client)["trials"][-1]["cause"] == "being probed by another worker"
    assert _get(client, f"/studies/{STUDY}")["progress"]["trials"] == 9

    # it finishes: its value shows, and the page it is on is now settled (cached) with it
    study.tell(trial, 123.0)
    for _ in range(2):
        last = _page(client, offset=8)["trials"][0]
        assert last["state"] == "COMPLETE" and last["value"] == 123.0


def _full_count(engine: sa.Engine, sid: int) -> dict[str, int]:
    q = sa.select(TRIALS.c.state, sa.func.count()).where(TRIALS.c.study_id == sid).group_by(TRIALS.c.state)
    with engine.connect() as conn:
        return {(s if isinstance(s, TrialState) else TrialState[s]).name: int(n) for s, n in conn.execute(q).all()}


def test_a_trial_that_appears_below_the_counted_ids_is_counted(url: str) -> None:
    """PostgreSQL hands out a trial id before its INSERT commits, so a trial of a smaller id than the last one counted
    can appear later; the counts start over instead of missing it."""
    storage = optuna_storage(url, None, None)
    study = optuna.load_study(study_name=STUDY, storage=storage)
    study.tell(7, state=TrialState.PRUNED)  # every trial finished: the counts settle them all
    other = optuna.create_study(study_name="other", storage=storage)
    other.ask()  # takes the next trial id, freed again below
    gap = other.trials[0]._trial_id
    study.add_trial(optuna.trial.create_trial(state=TrialState.FAIL))  # an id above the gap
    engine = Store(url).engine
    counts = TrialCounts()
    sid = study._study_id
    with engine.connect() as conn:
        assert counts.counts(conn, sid) == _full_count(engine, sid)
    optuna.delete_study(study_name="other", storage=storage)
    with engine.begin() as conn:  # the late commit: a finished trial below the counted ids
        conn.execute(sa.insert(TRIALS).values(trial_id=gap, number=99, study_id=sid, state=TrialState.COMPLETE))
    with engine.connect() as conn:
        again = counts.counts(conn, sid)
    assert again == _full_count(engine, sid) and again["COMPLETE"] == 5


def test_fold_settles_only_the_trials_below_the_first_unfinished_one() -> None:
    done, running = TrialState.COMPLETE, TrialState.RUNNING
    tally, counts = fold(Tally(), [(1, done), (2, running), (3, TrialState.PRUNED)])
    assert tally == Tally(2, {"COMPLETE": 1}) and counts == {"COMPLETE": 1, "PRUNED": 1, "RUNNING": 1}
    tally, counts = fold(tally, [(2, done), (3, TrialState.PRUNED), (5, done)])  # the tail from id 2 on
    assert tally == Tally(6, {"COMPLETE": 3, "PRUNED": 1}) and counts == {"COMPLETE": 3, "PRUNED": 1}
    assert fold(tally, []) == (tally, {"COMPLETE": 3, "PRUNED": 1})
