"""One search, whatever front door asked for it: ``tuner.tune`` is a session, `tuner search` renders a session's
events, ``POST /studies`` builds its request with the same ``prepare_request`` (tuner.session.options), the benchmarks
build their estimator with the same tuner.session.memory.

A session runs the steps in this order: options -> request -> create or resume the study -> host checks -> open the
worker's place in the study and recover what gone workers left -> estimator -> strategy -> run. What varies between
faces is injected here, at the edge: the probe launcher (the real runner, or a replay of recorded tables), the events
(what the face shows: nothing, a live display, the caller's listener), the clock and the settings (read once).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from trials.contract import ProbeConfig, ProbeResult
from tuner.files import private_dir
from tuner.probing.args_check import check_trainer_args
from tuner.records import StudyDefinition
from tuner.search.request import SearchRequest, check_resume, request_from_definition
from tuner.search.strategy import SearchSetup, Strategy
from tuner.session.checks import check_host, check_world_size
from tuner.session.crash_line import keep_trace
from tuner.session.driver import Listener, Search, SearchSummary
from tuner.session.memory import MemoryModel, baseline_trace, traced
from tuner.session.options import PYTHON, Face, SearchOptions, prepare_request
from tuner.session.plan import Plan, plan
from tuner.session.recovery import Recovered, open_study, recover, worker_name
from tuner.settings import Settings, load_settings
from tuner.storage import Store
from tuner.storage.journal import Journal, journal_places
from tuner.units import Deadline

__all__ = ["Events", "Joined", "Probe", "Ran", "SearchSession", "join", "open_search", "resolve", "start_strategy"]

Probe = Callable[[ProbeConfig], ProbeResult]
CHECKING_HOST = "checking the devices (GPU type, NCCL preflight) ..."
TRACING = "tracing one training step for the memory estimate ..."


class Events:
    """What a session tells the face that runs it, in order. This base shows nothing (``tuner.tune`` without a
    listener); `tuner search` renders every event (tuner.cli.search)."""

    def step(self, what: str) -> AbstractContextManager[Any]:
        """Around a step that takes a while (``what`` says which): the host checks, the memory trace."""
        return nullcontext()

    def opened(self, request: SearchRequest, resumed: bool) -> None:
        """The study is created or resumed, the worker joined it: ``request`` is what it searches."""

    def estimated(self, note: str | None) -> None:
        """How the memory trace went (None: no trace was asked for)."""

    def running(self, request: SearchRequest, deadline: Deadline) -> AbstractContextManager[Listener | None]:
        """Around the search's run: the listener the driver tells of each probe (None: nobody)."""
        return nullcontext()

    def node(self, line: str) -> None:
        """A search across nodes: what this worker does as a node (leads, follows, ran its part of a probe)."""


class ListenerEvents(Events):
    """Events for a caller's own driver listener (``tune(listener=...)``)."""

    def __init__(self, listener: Listener | None) -> None:
        self.listener = listener

    @contextmanager
    def running(self, request: SearchRequest, deadline: Deadline) -> Iterator[Listener | None]:
        yield self.listener


@dataclass(frozen=True)
class Ran:
    """What a session's run leaves: the request as resumed, its storage, and the driver's summary."""

    request: SearchRequest
    store: Store
    resumed: bool
    summary: SearchSummary


def resolve(request: SearchRequest, explicit: set[str], store: Store) -> tuple[SearchRequest, bool]:
    """Creates the study definition, or resumes an existing one with its stored definition (the options the user
    set must agree with it: tuner.search.request.check_resume)."""
    wanted = request.definition()
    stored, created = store.create_study(request.study_name, wanted)
    if created:
        return request, False
    check_resume(request.study_name, stored, wanted, explicit)
    return request_from_definition(request, StudyDefinition.from_json(stored, request.study_name)), True


@dataclass(frozen=True)
class Joined:
    """A worker's place in a study: the Optuna study opened, its journal, and what gone workers left recovered."""

    store: Store
    study: optuna.Study
    journal: Journal
    worker: str
    recovered: Recovered

    def search(
        self, request: SearchRequest, probe: Probe, deadline: Deadline, memory: MemoryModel = MemoryModel()
    ) -> Search:
        """The driver over a strategy that starts from ``memory`` (the estimator and the ZeRO-ordering frontier)."""
        strategy = start_strategy(self.study, request, memory, worker=self.worker)
        return Search(
            request,
            probe,
            store=self.store,
            study=self.study,
            strategy=strategy,
            journal=self.journal,
            worker=self.worker,
            deadline=deadline,
        )


def start_strategy(
    study: optuna.Study, request: SearchRequest, memory: MemoryModel, *, worker: str | None = None
) -> Strategy:
    """The strategy of ``request`` on ``study``, starting from ``memory``: what the driver runs, and what the
    benchmarks' replay of our strategy runs (benchmarks/strategies/ours.py)."""
    return Strategy(study, SearchSetup.of(request), estimator=memory.estimator, frontier=memory.frontier, worker=worker)


def join(request: SearchRequest, store: Store, cache_dir: Path) -> Joined:
    """Opens the study for this worker and recovers, first, what gone workers of this host left: their journals'
    rows stored, their trials told or failed, stale trials failed (tuner.session.recovery.recover)."""
    study = open_study(request.study_name, request.storage, request.seed, fail_stale=False)
    worker = worker_name()
    places = journal_places(request.storage, private_dir(cache_dir))
    recovered = recover(store, study, places, worker, request.headroom)
    return Joined(store, study, Journal(places[0], request.study_name, worker, places[1:]), worker, recovered)


def open_search(
    request: SearchRequest,
    probe: Probe,
    *,
    settings: Settings | None = None,
    clock: Callable[[], float] = time.monotonic,
    memory: MemoryModel = MemoryModel(),
) -> Search:
    """The driver of ``request``'s study, joined and recovered, with no session around it (the study must exist;
    tests drive it this way)."""
    settings = settings or load_settings(storage=request.storage)
    deadline = Deadline(request.budget_s, clock=clock)
    store = Store(request.storage)
    return join(request, store, settings.cache_dir).search(request, probe, deadline, memory)


def real_probe(settings: Settings) -> Probe:
    """The probe launcher of a real search: one tuner.probing.runner.ProbeRunner with this session's settings (an
    unknown launcher is refused here, before the study is written), behind DeepSpeed's own check of each config's
    scheduler (a config it refuses is refused before launching: tuner.probing.schedule_check)."""
    from tuner.probing.runner import ProbeRunner
    from tuner.probing.schedule_check import ScheduleChecked

    runner = ProbeRunner(settings)
    return ScheduleChecked(runner, runner.env)


class SearchSession:
    """One search: ``run()`` does every step, ``plan()`` the dry run. ``probe`` None: the real runner, after the host
    checks (a replayed ``probe`` runs none); ``settings`` None: read once here, from the environment and
    ``options.storage``."""

    def __init__(
        self,
        options: SearchOptions,
        *,
        face: Face = PYTHON,
        probe: Probe | None = None,
        events: Events | None = None,
        settings: Settings | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.options = options
        self.face = face
        self.probe = probe
        self.events = events or Events()
        self.settings = settings or load_settings(storage=options.storage)
        self.clock = clock

    def request(self) -> tuple[SearchRequest, set[str]]:
        """The request the options ask for, checked, and the settings given explicitly."""
        request, explicit = prepare_request(self.options, self.settings.storage, self.face, self.settings.cache_dir)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        return request, explicit

    def plan(self) -> tuple[SearchRequest, Plan]:
        """The dry run: what the search would do; writes nothing, probes nothing."""
        request, _ = self.request()
        check_trainer_args(request.job)  # their TrainingArguments' verdict, as every probe would meet it
        with self.events.step(TRACING):
            return request, plan(request, self.options.estimate)

    def run(self) -> Ran:
        request, explicit = self.request()
        real = self.probe is None
        if real:
            check_world_size(request)  # before the study is written or any probe runs
            check_trainer_args(request.job)  # their TrainingArguments' verdict, as every probe would meet it
        probe = self.probe or (real_probe(self.settings) if request.nnodes == 1 else None)
        store = Store(request.storage)
        request, resumed = resolve(request, explicit, store)
        if real:
            with self.events.step(CHECKING_HOST):
                check_host(request, store, resumed, self.settings)
        deadline = Deadline(request.budget_s, clock=self.clock)  # the trace below counts against the budget
        if probe is None:  # one worker per node, in step through the database (tuner.session.node_session)
            from tuner.session.node_session import run_across_nodes

            return run_across_nodes(
                request,
                store,
                deadline,
                self.settings,
                self.events,
                lead=lambda node_probe: self.lead(request, store, resumed, deadline, node_probe),
                followed=lambda summary: Ran(request, store, resumed, summary),
                trials=lambda: len(join(request, store, self.settings.cache_dir).study.get_trials(deepcopy=False)),
            )
        return self.lead(request, store, resumed, deadline, probe)

    def lead(self, request: SearchRequest, store: Store, resumed: bool, deadline: Deadline, probe: Probe) -> Ran:
        """The search itself on this worker: joined to the study (what gone workers left recovered), its memory
        traced, its probes run by ``probe``."""
        joined = join(request, store, self.settings.cache_dir)
        self.events.opened(request, resumed)
        with self.events.step(TRACING):
            memory = traced(request, self.options.estimate)
            # with data: kept with the study, for the crash line of `tuner trials` (the baseline's alone, at least)
            kept = memory.estimator.trace if memory.estimator else baseline_trace(request, self.options.estimate)
        if kept is not None:
            keep_trace(store, request.study_name, kept)
        self.events.estimated(memory.note)
        search = joined.search(request, probe, deadline, memory)
        with self.events.running(request, deadline) as listener:
            search.listener = listener
            summary = search.run()
        return Ran(request, store, resumed, summary)
