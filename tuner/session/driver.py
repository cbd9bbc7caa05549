"""The search driver: runs the strategy's proposals as real probes inside a wall-clock budget, on the database.

It writes the Optuna RDB study, the project's tables (search run, claims, probe rows), the local journal of unstored
rows, and runs the probe launcher and the trial heartbeat. The decisions are tuner.search.strategy's; what a run
recovers first of gone workers (journals, dead local workers) is tuner.session.recovery's, called by the session.

A finished probe's row goes to the journal (tuner.storage.journal), then to the database, and only then is Optuna
told: a kill -9 or an outage at any instant loses no finished measurement (the next run on this host replays the
journal, and a trial left RUNNING with its row stored is told from the row). Storage errors: a lost connection is
waited for (STORAGE_PATIENCE_S, or the budget left, on one clock per outage), anything else stops the search on one
line (tuner.storage.faults).
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import optuna
from optuna.trial import TrialState
from sqlalchemy.exc import DBAPIError, InvalidatePoolError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from trials.contract import ProbeConfig, ProbeResult
from tuner.errors import StorageError
from tuner.records import Candidate, Fidelity, ProbeRow, ProbeStatus, baseline_row
from tuner.records.run import RunStatus
from tuner.records.throughput import Throughput, config_throughput
from tuner.search.request import SearchRequest
from tuner.search.selection import best_stable
from tuner.search.strategy import Outcome, Proposal, Strategy
from tuner.search.study import retell, storage_of, tell_skipped, trial_id
from tuner.storage import Store
from tuner.storage.faults import StorageStopped, first_line, is_connection_loss
from tuner.storage.journal import Entry, Journal
from tuner.units import Deadline

__all__ = ["Listener", "Search", "SearchSummary"]

Probe = Callable[[ProbeConfig], ProbeResult]
HEARTBEAT_S = 10.0
# we keep trials alive with our own heartbeat thread (ask/tell has none): optuna's reminder does not apply
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
# the database went away (restart, network): retried with backoff this long (or the budget left, if shorter) before
# the search stops on one line
STORAGE_PATIENCE_S = 600.0
MAX_BACKOFF_S = 30.0
# another worker holds the claim of what this one proposed: the next proposal waits this long, doubling per claim lost
# in a row (up to LOST_CLAIM_MAX_S), so workers racing for one config (the baseline) do not spin creating trials
LOST_CLAIM_BACKOFF_S = 0.5
LOST_CLAIM_MAX_S = 10.0
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
    # the baseline config's figure over every probe of it (tuner.records.throughput), as the other faces show it
    baseline_throughput: Throughput | None = None


def _json_record(row: ProbeRow) -> dict[str, Any]:
    """The row's columns as the journal keeps them (ProbeRow.from_record reads them back)."""
    return json.loads(json.dumps(row.to_record(), default=str))


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


class Search:
    """Runs one worker's search. Its constructor takes what it works on and does no I/O: the session
    (tuner.session.session) opens the storage and the Optuna study, recovers what gone workers left
    (tuner.session.recovery.recover) and builds the strategy first."""

    def __init__(
        self,
        request: SearchRequest,
        probe: Probe,
        *,
        store: Store,
        study: optuna.Study,
        strategy: Strategy,
        journal: Journal,
        worker: str,
        deadline: Deadline,
        listener: Listener | None = None,
    ) -> None:
        self.request = request
        self.probe = probe
        self.listener = listener
        self.deadline = deadline
        self.store = store
        self.study = study
        self.worker = worker
        self.journal = journal
        self.strategy = strategy
        self.probes_run = 0
        self.probe_seconds = 0.0
        self._outage_since: float | None = None  # when the current storage outage began (monotonic)
        self._delay = 1.0
        self._lost_in_a_row = 0
        self._deferred_baseline: str | None = None  # the baseline's config key while another worker probes it
        self._untold: tuple[optuna.trial.Trial, ProbeRow] | None = None  # stored, Optuna not told yet
        self._journaled_in: Path | bool | None = False  # where the last row was journaled (False: none yet)

    def _sync(self) -> None:
        self.strategy.load_rows(self._rows())
        if self._deferred_baseline is not None and self.strategy.baseline_deferred:
            owner = self.store.claim_owner(self.request.study_name, self._deferred_baseline, Fidelity.BASELINE.value)
            if owner is None or self._stale(owner):  # its worker died before storing it: propose it again
                self.strategy.baseline_deferred = False
                self._deferred_baseline = None

    def _rows(self) -> list[ProbeRow]:
        return self.store.probes(self.request.study_name)

    def _record(self, row: ProbeRow, run_id: int) -> ProbeRow:
        """Keeps ``row``: journaled (durable on this host), then stored, waiting out a lost connection; a storage
        that refuses it stops the search (the journal keeps the row for the next run)."""
        full = dataclasses.replace(row, study_name=self.request.study_name, run_id=run_id)
        entry = Entry(uid=str(uuid.uuid4()), record=_json_record(full))
        where = self.journal.add(entry)
        moved, self._journaled_in = where != self._journaled_in, where
        if moved and where != self.journal.path and self.listener:  # said once per move; the database may take it
            failed = "; ".join(f"{p.parent}: {why}" for p, why in self.journal.failures.items())
            held = f"journaled in {where}" if where is not None else "held in memory only, written again later"
            self.listener.note(f"cannot write the journal ({failed}); the probe is {held}; storing it")
        self._durably(lambda: self.store.record_probe(full, entry.uid))
        self.journal.done(entry.uid)
        self._outage_since = None
        return full

    def _durably(self, write: Callable[[], object]) -> None:
        while True:
            try:
                write()
                return
            except STORAGE_ERRORS as err:
                self._outage(err)

    def run(self) -> SearchSummary:
        name = self.request.study_name
        run_id = self.store.start_run(name, self.worker, self.request.budget_s, None)
        reason, status = "budget", RunStatus.FINISHED
        try:
            reason = self._loop_through_outages(run_id)
        except KeyboardInterrupt:
            status, reason = RunStatus.INTERRUPTED, "interrupted"
            raise
        except Exception as err:
            status, reason = RunStatus.FAILED, f"{type(err).__name__}: {err}"
            raise
        finally:
            try:
                self.store.finish_run(run_id, status, reason)
            except STORAGE_ERRORS:
                pass  # still unreachable: the run stays "running" until its heartbeat goes stale
        return self.summary(run_id, reason)

    def _loop_through_outages(self, run_id: int) -> str:
        """Runs the loop; when the connection to the database is lost, waits for a write (the run's heartbeat) to
        succeed again and goes on (finished probes are stored or journaled, the loop re-reads them), or stops with
        one clear line once the outage outlasts STORAGE_PATIENCE_S or the budget. Any other storage error stops the
        search at once (tuner.storage.faults)."""
        while True:
            try:
                if self._untold is not None:  # an outage hit between storing a row and telling Optuna
                    trial, row = self._untold
                    retell(self.study, trial, row, self.request.headroom)
                    self._untold = None
                return self._loop(run_id)
            except StorageStopped:
                raise
            except STORAGE_ERRORS as err:
                self._outage(err)
                self._durably(lambda: self.store.heartbeat(run_id))

    def _outage(self, err: BaseException) -> None:
        """Decides on a storage error: raises StorageError (one line) unless it is a lost connection within patience,
        in which case it waits one backoff step."""
        what = first_line(err)[:160]
        if not is_connection_loss(err):
            self.journal.note_stop(f"storage refused a write: {what}")
            raise StorageStopped(
                f"storage refused the search's read or write ({what}); {self.journal.kept()}: fix the database "
                "(space, permissions, a writable primary) and re-run the same command to resume"
            ) from None
        now = time.monotonic()
        if self._outage_since is None:
            self._outage_since, self._delay = now, 1.0
            if self.listener:
                self.listener.note(f"storage unreachable ({what[:120]}); retrying with backoff")
        waited = now - self._outage_since
        patience = min(STORAGE_PATIENCE_S, max(self.deadline.left, 0.0))
        if waited >= patience:
            self.journal.note_stop(f"storage unreachable for {waited:.0f} s: {what}")
            raise StorageStopped(
                f"storage unreachable for {waited:.0f} s ({what}); {self.journal.kept()}: re-run the same command "
                "to resume"
            ) from None
        time.sleep(min(self._delay, patience - waited))
        self._delay = min(self._delay * 2, MAX_BACKOFF_S)

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
            self._lost_in_a_row = 0
            self._run_one(proposal, run_id)
            self._outage_since = None

    def _claim(self, proposal: Proposal) -> bool:
        name = self.request.study_name
        key, fidelity = proposal.config_key, proposal.fidelity.value
        if self.store.claim(name, key, fidelity, proposal.trial_number, self.worker):
            return True  # new, or already this worker's own
        owner = self.store.claim_owner(name, key, fidelity)
        if owner is None:  # released between the two reads
            return self.store.claim(name, key, fidelity, proposal.trial_number, self.worker)
        if not self._stale(owner):
            return False
        # the owner is gone; it stores a probe's row before its run ends or its heartbeat stops, so the storage read
        # after the liveness check tells a finished probe (reuse it) from one it died in (take the claim over)
        stored = self.store.probes(name, fidelity=fidelity)
        if any(r.config_key == key for r in stored):
            return False
        # compare-and-swap: of the workers taking over at once, only the one whose UPDATE still found the gone owner
        return self.store.take_over_claim(name, key, fidelity, owner, self.worker, proposal.trial_number)

    def _stale(self, owner: str) -> bool:
        """The claim's worker is gone (SearchRun.is_live: not running, or no heartbeat for STALE_AFTER_S), on the
        database's clock: the hosts' wall clocks need not agree."""
        runs = [r for r in self.store.runs(self.request.study_name) if r.worker == owner]
        return not runs or not runs[-1].is_live(self.store.db_now())

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
            return
        cause = "being probed by another worker"
        if proposal.fidelity == Fidelity.BASELINE and proposal.trial is not None:
            # explore meanwhile (its short probe too: only the baseline fidelity is taken); the row arrives by sync
            tell_skipped(self.study, proposal.trial, cause)
            self.strategy.baseline_deferred = True
            self._deferred_baseline = proposal.config_key
        else:
            self.strategy.abandon(proposal, cause)
        self._lost_in_a_row += 1
        if self._lost_in_a_row > 1:
            delay = min(LOST_CLAIM_BACKOFF_S * 2 ** (self._lost_in_a_row - 2), LOST_CLAIM_MAX_S, self.deadline.left)
            time.sleep(max(delay, 0.0))

    def _run_one(self, proposal: Proposal, run_id: int) -> None:
        if self.listener:
            self.listener.started(proposal)
        beating = trial_id(proposal.trial) if proposal.trial is not None else None
        try:
            with _Heartbeat(storage_of(self.study), beating, self.store, run_id):
                result = self.probe(proposal.config)
        except BaseException:
            # interrupted or the runner itself broke: leave no RUNNING trial and no claim behind
            if proposal.trial is not None:
                proposal.trial.set_user_attr("status", ProbeStatus.INTERRUPTED.value)
                self.study.tell(proposal.trial, state=TrialState.FAIL)
            self.store.release_claim(self.request.study_name, proposal.config_key, proposal.fidelity, self.worker)
            raise
        self.probes_run += 1
        self.probe_seconds += result.wall_s

        def record(row: ProbeRow) -> None:  # before Optuna is told (strategy.observe)
            stored = self._record(row, run_id)
            if proposal.trial is not None:
                self._untold = (proposal.trial, stored)

        outcome = self.strategy.observe(proposal, result, record=record)
        self._untold = None
        self.store.heartbeat(run_id)
        if self.listener:
            self.listener.finished(proposal, outcome)

    def summary(self, run_id: int, reason: str) -> SearchSummary:
        rows = self._rows()
        counts = self.store.count_probes(self.request.study_name)
        return SearchSummary(
            study_name=self.request.study_name,
            run_id=run_id,
            elapsed_s=self.deadline.elapsed,
            stop_reason=reason,
            counts=counts,
            best=best_stable(rows),
            baseline=baseline_row(rows),
            probes_run=self.probes_run,
            probe_seconds=self.probe_seconds,
            trials=len(self.study.get_trials(deepcopy=False, states=None)),
            baseline_throughput=config_throughput(rows, baseline_row(rows)),
        )
