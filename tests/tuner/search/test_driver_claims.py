"""tuner.search.driver claims: a gone worker's claim is taken over only when it did not finish the probe."""

from __future__ import annotations

from pathlib import Path

from trials.contract import Knobs, ModelSpec, ProbeConfig, ProbeResult
from tuner.job.objective import objective_for
from tuner.job.space import space_from_dict
from tuner.search.driver import Search
from tuner.search.request import SearchRequest
from tuner.search.rows import Fidelity, ProbeRow
from tuner.search.strategy import Proposal
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

    return Search(request, never)


def _gone_owner(store: Store, key: str, *, finished_probe: bool) -> None:
    run = store.start_run("claims", "other-host:1", 60.0, None)
    assert store.claim("claims", key, Fidelity.CONFIRM.value, None, "other-host:1")
    if finished_probe:  # it stored the confirm probe's row, then its run ended
        row = {"study_name": "claims", "config_key": key, "fidelity": "confirm", "status": "ok", "knobs": {}}
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
