"""tuner.session.driver claims: a gone worker's claim is taken over only when it did not finish the probe."""

from __future__ import annotations

from pathlib import Path

from trials.contract import Knobs, ModelSpec, ProbeConfig, ProbeResult
from tuner.job.objective import objective_for
from tuner.job.space import space_from_dict
from tuner.records import Fidelity, ProbeRow
from tuner.search.request import SearchRequest
from tuner.search.strategy import Proposal
from tuner.session.driver import Search
from tuner.session.session import open_search
from tuner.storage import Store

KNOBS = Knobs(micro_batch_size=2, max_length=16, engine="torch")


def _search(url: str) -> Search:
    space = space_from_dict({"micro_batch_size": [2], "max_length": [16], "engine": ["torch"], "zero_stage": [0]})
    request = SearchRequest(
        study_name="claims",
        storage=url,
        model=ModelSpec(),
        space=space,
        world_size=1,
        global_batch=2,
        objective=objective_for([16]),
        budget_s=60,
    )

    def never(config: ProbeConfig) -> ProbeResult:
        raise AssertionError("no probe runs in these tests")

    return open_search(request, never)


def _gone_owner(store: Store, key: str, *, finished_probe: bool) -> None:
    run = store.start_run("claims", "other-host:1", 60.0, None)
    assert store.claim("claims", key, Fidelity.CONFIRM.value, None, "other-host:1")
    if finished_probe:  # it stored the confirm probe's row, then its run ended
        row = {"study_name": "claims", "config_key": key, "fidelity": "confirm", "status": "ok", "knobs": {}}
        row |= {"result": {}, "peak_allocated": 1}  # a measured ok row has its result and its peak
        store.record_probe(ProbeRow.from_record({**row, "knobs": KNOBS.model_dump(mode="json"), "run_id": run}))
    store.finish_run(run, "finished" if finished_probe else "interrupted")


def _proposal(key: str) -> Proposal:
    return Proposal(ProbeConfig(knobs=KNOBS), Fidelity.CONFIRM, key, None, 1.0)


def test_a_finished_workers_claim_is_not_taken_over_when_its_row_is_stored(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 't.db'}"
    search = _search(url)  # its own rows were read before the other worker stored its confirm probe
    _gone_owner(search.store, "k1", finished_probe=True)
    assert search._claim(_proposal("k1")) is False
    assert search.store.claim_owner("claims", "k1", "confirm") == "other-host:1"


def test_a_dead_workers_claim_without_a_row_is_taken_over(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 't.db'}"
    search = _search(url)
    _gone_owner(search.store, "k2", finished_probe=False)
    assert search._claim(_proposal("k2")) is True
    assert search.store.claim_owner("claims", "k2", "confirm") == search.worker


# -- takeover as compare-and-swap (issue 13, point 8) ------------------------------------------------------------------
def _live_run(search: Search) -> int:
    return search.store.start_run("claims", search.worker, 60.0, None)


def test_two_workers_taking_over_one_stale_claim_at_once_get_it_once(storage_url: str) -> None:
    a, b = _search(storage_url), _search(storage_url)
    b.worker = "host-b:2"  # two workers (one process here: the worker name is what tells them apart)
    _live_run(a), _live_run(b)
    _gone_owner(a.store, "k3", finished_probe=False)
    # b reads the claim's owner (the gone worker) just before a takes the claim over: the interleaving of the race
    read_owner = b.store.claim_owner
    took: list[bool] = []

    def owner_then_a_takes_over(*args: str) -> str | None:
        owner = read_owner(*args)
        if not took:
            took.append(a._claim(_proposal("k3")))
        return owner

    b.store.claim_owner = owner_then_a_takes_over  # type: ignore[method-assign]
    assert b._claim(_proposal("k3")) is False, "b took over a claim a had already taken: the config is probed twice"
    assert took == [True]
    assert a.store.claim_owner("claims", "k3", "confirm") == a.worker


def test_a_worker_releases_only_its_own_claim(sqlite_url: str) -> None:
    search = _search(sqlite_url)
    assert search.store.claim("claims", "k4", "short", 1, "host-b:2")
    assert search.store.release_claim("claims", "k4", "short", search.worker) is False
    assert search.store.claim_owner("claims", "k4", "short") == "host-b:2"
    assert search.store.release_claim("claims", "k4", "short", "host-b:2") is True


def test_a_worker_recognises_its_own_claim(sqlite_url: str) -> None:
    """Its claim INSERT landed but the answer was lost (or it proposes the config again): the claim is its own, not
    'another worker's' blocking the config for the rest of the run."""
    search = _search(sqlite_url)
    _live_run(search)
    assert search._claim(_proposal("k5")) is True
    assert search._claim(_proposal("k5")) is True
    assert search.store.claim_owner("claims", "k5", "confirm") == search.worker


# -- database time (issue 13, point 12) --------------------------------------------------------------------------------
def test_liveness_is_judged_on_the_databases_clock_not_the_hosts(storage_url: str, monkeypatch) -> None:
    """A worker on a host whose wall clock is 10 minutes behind starts, claims and beats: it is live, and its claim is
    not taken over (on wall clocks its beat looks 10 minutes old)."""
    import datetime as dt

    import tuner.storage.store as store_module

    search = _search(storage_url)
    _live_run(search)
    wall = store_module.now
    monkeypatch.setattr(store_module, "now", lambda: wall() - dt.timedelta(minutes=10))
    other = Store(storage_url)
    run = other.start_run("claims", "slow-clock:7", 60.0, None)
    other.heartbeat(run)
    assert other.claim("claims", "k6", Fidelity.CONFIRM.value, None, "slow-clock:7")
    monkeypatch.setattr(store_module, "now", wall)
    assert search._stale("slow-clock:7") is False
    assert search._claim(_proposal("k6")) is False
    assert search.store.claim_owner("claims", "k6", "confirm") == "slow-clock:7"
    beat = search.store.runs("claims")[-1].heartbeat_at
    skew = abs(
        (search.store.db_now() - (beat if beat.tzinfo else beat.replace(tzinfo=dt.timezone.utc))).total_seconds()
    )
    assert skew < 60
