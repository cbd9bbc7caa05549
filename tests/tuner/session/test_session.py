"""tuner.session.session: one search's steps in one order for every face; the driver built from what the session
opened (its constructor does no I/O); recovery of gone workers as an explicit step."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import pytest

from benchmarks.table import Env, Table
from trials.contract import ModelSpec, ProbeConfig, ProbeResult
from tuner.job.objective import objective_for
from tuner.job.space import space_from_dict
from tuner.records import Fidelity, ProbeRow
from tuner.search.request import SearchRequest
from tuner.session.driver import Listener, Search
from tuner.session.options import SearchOptions
from tuner.session.session import TRACING, Events, SearchSession, join
from tuner.settings import load_settings
from tuner.storage import Store
from tuner.storage.journal import Entry, Journal, journal_dir
from tuner.units import Deadline

TABLE = Path(__file__).resolve().parents[3] / "benchmarks" / "tables" / "tiny-1rank.json"


class Recorded(Events):
    """Keeps every event a session tells, in order."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    def step(self, what: str) -> AbstractContextManager[Any]:
        self.seen.append(what)
        return nullcontext()

    def opened(self, request: SearchRequest, resumed: bool) -> None:
        self.seen.append(("opened", request.study_name, resumed))

    def estimated(self, note: str | None) -> None:
        self.seen.append(("estimated", note))

    @contextmanager
    def running(self, request: SearchRequest, deadline: Deadline) -> Iterator[Listener | None]:
        self.seen.append("running")
        yield None


def test_a_session_runs_its_steps_in_order_and_resumes_its_study(tmp_path: Path) -> None:
    """A replayed probe (a recorded table, as the benchmarks replay them) runs every step but the host checks."""
    table = Table.load(TABLE)
    env = Env(table=table, seed=0, budget_s=1e9)

    def probe(config: ProbeConfig) -> ProbeResult:
        return env.probe(config.knobs)

    options = SearchOptions(
        budget=300,
        storage=f"sqlite:///{tmp_path / 'tuner.db'}",
        study="replayed",
        space=dict(table.raw["space"]),
        global_batch=table.global_batch,
        device_memory=table.device_memory,
        n_trials=3,
        finalists=0,
        seed=0,
    )
    events = Recorded()
    ran = SearchSession(options, probe=probe, events=events).run()
    assert events.seen == [("opened", "replayed", False), TRACING, ("estimated", None), "running"]
    assert ran.summary.probes_run == len(env.probes) > 0 and not ran.resumed
    stored = ran.store.probes("replayed")
    assert sum(r.measured for r in stored) == len(env.probes)

    again = Recorded()
    resumed = SearchSession(options, probe=probe, events=again).run()
    assert again.seen[0] == ("opened", "replayed", True) and resumed.resumed


def test_the_driver_constructor_does_no_io() -> None:
    """Whatever it is handed is only kept: objects with no methods at all would fail on any read or write."""
    request = SearchRequest(
        study_name="none",
        storage="postgresql+psycopg://nobody@203.0.113.1:1/none",  # unreachable: never connected to
        model=ModelSpec(),
        space=space_from_dict({"micro_batch_size": [2], "max_length": [16]}),
        world_size=1,
        global_batch=2,
        objective=objective_for([16]),
        budget_s=60,
    )
    nothing: Any = object()

    def never(config: ProbeConfig) -> ProbeResult:
        raise AssertionError("no probe runs")

    search = Search(
        request,
        never,
        store=nothing,
        study=nothing,
        strategy=nothing,
        journal=nothing,
        worker="w:1",
        deadline=Deadline(60),
    )
    assert search.probes_run == 0 and search.store is nothing


def _dead_pid() -> int:
    done = subprocess.Popen(["true"])
    done.wait()
    return done.pid


def test_joining_a_study_recovers_a_dead_workers_journal_first(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    request = SearchRequest(
        study_name="gone",
        storage=url,
        model=ModelSpec(),
        space=space_from_dict({"micro_batch_size": [2], "max_length": [16]}),
        world_size=1,
        global_batch=2,
        objective=objective_for([16]),
        budget_s=60,
    )
    store = Store(url)
    settings = load_settings(storage=url)
    folder = journal_dir(url, settings.cache_dir)
    row = ProbeRow.from_record(
        {
            "study_name": "gone",
            "config_key": "k",
            "fidelity": "short",
            "status": "oom",
            "knobs": {"micro_batch_size": 2, "max_length": 16},
        }
    )
    Journal(folder, "gone", f"{socket.gethostname()}:{_dead_pid()}").add(Entry(uid="u1", record=row.to_record()))
    assert store.probes("gone") == []

    joined = join(request, store, settings.cache_dir)
    assert joined.recovered.replayed == 1 and joined.recovered.reaped == []
    assert [(r.config_key, r.fidelity) for r in store.probes("gone")] == [("k", Fidelity.SHORT)]
    assert join(request, store, settings.cache_dir).recovered.replayed == 0  # the journal is emptied


@pytest.mark.parametrize("given", [{"max_lenght": 128}, {"budget": "1m", "lora_rank": 8}])
def test_tune_refuses_a_setting_it_does_not_declare(given: dict[str, Any], tmp_path: Path) -> None:
    import tuner
    from tuner.errors import ConfigError

    with pytest.raises(ConfigError, match="tune\\(\\) got unknown settings"):
        tuner.tune(storage=f"sqlite:///{tmp_path / 't.db'}", **given)
