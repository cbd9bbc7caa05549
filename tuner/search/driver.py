"""The search driver: runs the strategy's proposals as real probes inside a wall-clock budget, on the database.

Everything with a side effect lives here: the Optuna RDB study, the project's tables (study definition, search run,
claims, probe rows), the probe runner and the trial heartbeat. The decisions are tuner.search.strategy's.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import socket
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import optuna
from optuna.trial import TrialState
from sqlalchemy.exc import DBAPIError, InvalidatePoolError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from trials.contract import ProbeConfig, ProbeResult
from tuner.errors import StorageError
from tuner.memory.estimator import Estimator
from tuner.memory.frontier import Frontier
from tuner.memory.tracing import stage_order
from tuner.probing.forkserver import pid_alive
from tuner.search.evidence import EstimatorLike
from tuner.search.liveness import run_is_live
from tuner.search.request import SearchRequest
from tuner.search.rows import Fidelity, ProbeRow
from tuner.search.sampling import make_sampler
from tuner.search.selection import Candidate, best_stable
from tuner.search.strategy import Outcome, Proposal, SearchSetup, Strategy
from tuner.storage import Store, optuna_storage
from tuner.units import Deadline

__all__ = ["Listener", "Search", "SearchSummary", "open_study", "reap_dead_local_workers", "worker_name"]

Probe = Callable[[ProbeConfig], ProbeResult]
HEARTBEAT_S = 10.0
# we keep trials alive with our own heartbeat thread (ask/tell has none): optuna's reminder does not apply
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
# the database went away (restart, network): retried with backoff this long before the search stops on one line
STORAGE_PATIENCE_S = 600.0
STORAGE_ERRORS: tuple[type[BaseException], ...] = (
    OperationalError,
    DBAPIError,
    InvalidatePoolError,
    PoolTimeout,
    StorageError,
    optuna.exceptions.StorageInternalError,
)


class Listener(Protocol):
    """What the driver tells the progress display."""

    def started(self, proposal: Proposal) -> None: ...

    def finished(self, proposal: Proposal, outcome: Outcome) -> None: ...

    def inferred(self, row: ProbeRow) -> None: ...

    def note(self, message: str) -> None: ...


@dataclass
class SearchSummary:
    study_name: str
    run_id: int
    elapsed_s: float
    stop_reason: str
    counts: dict[str, int]
    best: Candidate | None
    baseline: ProbeRow | None  # the baseline's probe row, if one was probed
    probes_run: int
    probe_seconds: float
    trials: int


class _Heartbeat:
    """Keeps the running Optuna trial and our search run alive in the database while a probe runs."""

    def __init__(self, storage: Any, trial_id: int | None, store: Store, run_id: int) -> None:
        self.storage, self.trial_id, self.store, self.run_id = storage, trial_id, store, run_id
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tuner-heartbeat", daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                if self.trial_id is not None:
                    self.storage.record_heartbeat(self.trial_id)
                self.store.heartbeat(self.run_id)
            except STORAGE_ERRORS:
                continue  # the database is away: the next beat tries again; the search loop handles the outage

    def __enter__(self) -> _Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def open_study(name: str, url: str, seed: int | None) -> optuna.Study:
    with warnings.catch_warnings():  # heartbeats and fail_stale_trials are "experimental" in optuna 5
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        storage = optuna_storage(url)
        study = optuna.create_study(
            study_name=name, storage=storage, direction="maximize", sampler=make_sampler(seed), load_if_exists=True
        )
        optuna.storages.fail_stale_trials(study)  # RUNNING trials of a killed worker become FAIL
    return study


def reap_dead_local_workers(store: Store, study: optuna.Study, me: str) -> list[str]:
    """Closes the runs of workers on this host whose process is gone (kill -9, the OOM killer) now, instead of after
    the heartbeat grace period: each RUNNING trial they claimed fails with the cause, their claims are released.
    Returns the causes recorded."""
    host = socket.gethostname()
    name = study.study_name
    causes: list[str] = []
    for run in store.runs(name):
        worker = str(run["worker"])
        w_host, _, pid = worker.rpartition(":")
        if run["status"] != "running" or w_host != host or not pid.isdigit() or worker == me or pid_alive(int(pid)):
            continue
        cause = f"interrupted: worker {worker} died during the probe (killed); failed on resume by {me}"
        running = {t.number: t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
        claimed = store.worker_claims(name, worker)
        # its trials: the ones it claimed, and the ones it asked for but was killed before claiming
        mine = {c["trial_number"] for c in claimed} | {
            n for n, t in running.items() if t.user_attrs.get("worker") == worker
        }
        for number in sorted(n for n in mine if n in running):
            trial = running[number]
            study._storage.set_trial_user_attr(trial._trial_id, "status", "interrupted")
            study._storage.set_trial_user_attr(trial._trial_id, "cause", cause)
            study.tell(trial.number, state=TrialState.FAIL)
            causes.append(f"trial {trial.number}: {cause}")
        for claim in claimed:
            store.release_claim(name, claim["config_key"], claim["fidelity"])
        store.finish_run(int(run["id"]), "interrupted", cause)
    return causes


class Search:
    def __init__(
        self,
        request: SearchRequest,
        probe: Probe,
        *,
        listener: Listener | None = None,
        estimator: EstimatorLike | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.request = request
        self.probe = probe
        self.listener = listener
        self.deadline = Deadline(request.budget_s, clock=clock)
        self.store = Store(request.storage)
        self.study = open_study(request.study_name, request.storage, request.seed)
        self.worker = worker_name()
        self.reaped = reap_dead_local_workers(self.store, self.study, self.worker)
        self.strategy = Strategy(self.study, SearchSetup.of(request), estimator=estimator, worker=self.worker)
        self.probes_run = 0
        self.probe_seconds = 0.0

    def attach_estimator(self, estimator: Estimator | None) -> None:
        """Adds the memory estimate, and with it the ZeRO stage order the frontier may use."""
        self.strategy.estimator = estimator
        order = stage_order(estimator, self.request) if estimator is not None else None
        if order:
            self.strategy.use_frontier(Frontier(stage_need=order))

    def _sync(self) -> None:
        self.strategy.load_rows(self._rows())

    def _rows(self) -> list[ProbeRow]:
        return self.store.probes(self.request.study_name)

    def _record(self, row: ProbeRow, run_id: int) -> None:
        self.store.record_probe(dataclasses.replace(row, study_name=self.request.study_name, run_id=run_id))

    def run(self) -> SearchSummary:
        name = self.request.study_name
        run_id = self.store.start_run(name, self.worker, self.request.budget_s, None)
        reason, status = "budget", "finished"
        try:
            reason = self._loop_through_outages(run_id)
        except KeyboardInterrupt:
            status, reason = "interrupted", "interrupted"
            raise
        except Exception as err:
            status, reason = "failed", f"{type(err).__name__}: {err}"
            raise
        finally:
            try:
                self.store.finish_run(run_id, status, reason)
            except STORAGE_ERRORS:
                pass  # still unreachable: the run stays "running" until its heartbeat goes stale
        return self.summary(run_id, reason)

    def _loop_through_outages(self, run_id: int) -> str:
        """Runs the loop; when the database goes away, waits for it with backoff (finished probes are committed, the
        loop re-reads them) and goes on, or stops with one clear line after STORAGE_PATIENCE_S."""
        while True:
            try:
                return self._loop(run_id)
            except STORAGE_ERRORS as err:
                self._wait_for_storage(err)

    def _wait_for_storage(self, err: BaseException) -> None:
        root: BaseException = err
        while (inner := getattr(root, "orig", None) or root.__cause__) is not None:  # optuna wraps the driver's error
            root = inner
        first = (str(root).strip().splitlines() or [type(root).__name__])[0]
        if self.listener:
            self.listener.note(f"storage unreachable ({first[:120]}); retrying with backoff")
        start, delay = time.monotonic(), 1.0
        while True:
            time.sleep(delay)
            try:
                with self.store.engine.connect() as conn:
                    conn.exec_driver_sql("SELECT 1")
                return
            except STORAGE_ERRORS:
                pass
            if time.monotonic() - start > min(STORAGE_PATIENCE_S, max(self.deadline.left, 0.0)):
                raise StorageError(
                    f"storage unreachable for {time.monotonic() - start:.0f} s ({first[:160]}); every finished probe "
                    "is stored: re-run the same command to resume"
                ) from None
            delay = min(delay * 2, 30.0)

    def _loop(self, run_id: int) -> str:
        while True:
            self._sync()
            left = self.deadline.left
            proposal = self.strategy.propose(left)
            for row in self.strategy.drain():
                self._record(row, run_id)
                if self.listener:
                    self.listener.inferred(row)
            if proposal is None:
                return self._why_stopped()
            if not self._claim(proposal):
                self._lost_claim(proposal)
                continue
            self._run_one(proposal, run_id)

    def _claim(self, proposal: Proposal) -> bool:
        name = self.request.study_name
        args = (name, proposal.config_key, proposal.fidelity, proposal.trial_number, self.worker)
        if self.store.claim(*args):
            return True
        owner = self.store.claim_owner(name, proposal.config_key, proposal.fidelity)
        if owner is None or not self._stale(owner):
            return False
        # the owner is gone; it stores a probe's row before its run ends or its heartbeat stops, so the storage read
        # after the liveness check tells a finished probe (reuse it) from one it died in (take the claim over)
        stored = self.store.probes(name, fidelity=proposal.fidelity.value)
        if any(r.config_key == proposal.config_key for r in stored):
            return False
        self.store.release_claim(name, proposal.config_key, proposal.fidelity)
        return self.store.claim(*args)

    def _stale(self, owner: str) -> bool:
        """The claim's worker is gone (tuner.search.liveness: not running, or no heartbeat for STALE_AFTER_S)."""
        runs = [r for r in self.store.runs(self.request.study_name) if r["worker"] == owner]
        return not runs or not run_is_live(runs[-1], dt.datetime.now(dt.timezone.utc))

    def _why_stopped(self) -> str:
        s = self.strategy
        if s.converged:
            return f"converged: no config left is expected to gain {100 * s.schedule.min_expected_gain:g}%"
        if s.exhausted:
            return "space exhausted"
        if self.request.n_trials is not None and s.explored >= self.request.n_trials:
            return f"{self.request.n_trials} trials done"
        return "budget"

    def _lost_claim(self, proposal: Proposal) -> None:
        done = [r for r in self._rows() if r.config_key == proposal.config_key and r.fidelity == proposal.fidelity]
        if done:
            self.strategy.observe_row(proposal, done[-1])
        else:
            self.strategy.abandon(proposal, "being probed by another worker")

    def _run_one(self, proposal: Proposal, run_id: int) -> None:
        if self.listener:
            self.listener.started(proposal)
        trial_id = proposal.trial._trial_id if proposal.trial is not None else None
        try:
            with _Heartbeat(self.study._storage, trial_id, self.store, run_id):
                result = self.probe(proposal.config)
        except BaseException:
            # interrupted or the runner itself broke: leave no RUNNING trial and no claim behind
            if proposal.trial is not None:
                proposal.trial.set_user_attr("status", "interrupted")
                self.study.tell(proposal.trial, state=TrialState.FAIL)
            self.store.release_claim(self.request.study_name, proposal.config_key, proposal.fidelity)
            raise
        self.probes_run += 1
        self.probe_seconds += result.wall_s
        outcome = self.strategy.observe(proposal, result)
        self._record(outcome.row, run_id)
        self.store.heartbeat(run_id)
        if self.listener:
            self.listener.finished(proposal, outcome)

    def summary(self, run_id: int, reason: str) -> SearchSummary:
        rows = self._rows()
        counts = self.store.count_probes(self.request.study_name)
        base = [r for r in rows if r.fidelity == Fidelity.BASELINE]
        return SearchSummary(
            study_name=self.request.study_name,
            run_id=run_id,
            elapsed_s=self.deadline.elapsed,
            stop_reason=reason,
            counts=counts,
            best=best_stable(rows),
            baseline=base[0] if base else None,
            probes_run=self.probes_run,
            probe_seconds=self.probe_seconds,
            trials=len(self.study.get_trials(deepcopy=False, states=None)),
        )
