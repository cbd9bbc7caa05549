"""The search driver: runs the strategy's proposals as real probes inside a wall-clock budget, on the database.

Everything with a side effect lives here: the Optuna RDB study, the project's tables (study definition, search run,
claims, probe rows), the probe runner and the trial heartbeat. The decisions are tuner.strategy's.
"""

from __future__ import annotations

import datetime as dt
import os
import socket
import threading
import warnings
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import optuna
from optuna.trial import TrialState

from trials.contract import Knobs, ModelSpec, ProbeConfig, ProbeResult
from tuner.budget import Deadline
from sqlalchemy.exc import DBAPIError, InvalidatePoolError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from tuner.errors import ConfigError, StorageError
from tuner.objective import Objective
from tuner.selection import Candidate, best_stable
from tuner.space import Space, space_from_definition
from tuner.storage import Store, optuna_storage
from tuner.strategy import EstimatorLike, Outcome, Proposal, Schedule, Strategy, make_sampler

Probe = Callable[[ProbeConfig], ProbeResult]
HEARTBEAT_S = 10.0
# we keep trials alive with our own heartbeat thread (ask/tell has none): optuna's reminder does not apply
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
STALE_CLAIM_S = 120.0  # a claim whose worker sent no heartbeat for this long is taken over
# the database went away (restart, network): retried with backoff this long before the search stops on one line
STORAGE_PATIENCE_S = 600.0
STORAGE_ERRORS: tuple[type[BaseException], ...] = (
    OperationalError, DBAPIError, InvalidatePoolError, PoolTimeout, StorageError,
    optuna.exceptions.StorageInternalError,
)


class Listener(Protocol):
    """What the driver tells the progress display."""

    def started(self, proposal: Proposal) -> None: ...

    def finished(self, proposal: Proposal, outcome: Outcome) -> None: ...

    def inferred(self, row: dict[str, Any]) -> None: ...

    def note(self, message: str) -> None: ...


@dataclass
class SearchRequest:
    study_name: str
    storage: str
    model: ModelSpec
    space: Space
    world_size: int
    global_batch: int
    objective: Objective
    budget_s: float
    device_memory: int | None = None
    headroom: float = 0.9
    n_trials: int | None = None
    baseline: Knobs | None = None
    baseline_source: dict[str, Any] | None = None  # what the user's baseline file said (for reports)
    schedule: Schedule = field(default_factory=Schedule)
    seed: int | None = None

    def definition(self) -> dict[str, Any]:
        return {
            "model": self.model.model_dump(mode="json"),
            "space": self.space.model_dump(mode="json"),
            "world_size": self.world_size,
            "global_batch": self.global_batch,
            "device_memory": self.device_memory,
            "headroom": self.headroom,
            "objective": self.objective.to_dict(),
            "budget_s": self.budget_s,
            "baseline": self.baseline.model_dump(mode="json") if self.baseline is not None else None,
            "baseline_source": self.baseline_source,
            "finalists": self.schedule.finalists,
        }


#: definition keys a resumed study must agree on: they decide which configs exist and what they measure
ESSENTIAL = ("model", "space", "world_size", "global_batch", "device_memory", "objective")


def check_resume(name: str, stored: dict[str, Any], wanted: dict[str, Any], explicit: set[str]) -> None:
    """A re-run of an existing study keeps its definition; an option the user set that contradicts it is an error."""
    for key in ESSENTIAL:
        if key in explicit and stored.get(key) != wanted.get(key):
            raise ConfigError(
                f"study {name!r} was created with a different {key} ({_short(stored.get(key))}); drop the option to "
                f"resume it, or pick a new --study name"
            )


def _short(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def request_from_definition(base: SearchRequest, stored: dict[str, Any]) -> SearchRequest:
    """The request to resume a study with: its stored definition, this run's budget, trials and seed."""
    return SearchRequest(
        study_name=base.study_name,
        storage=base.storage,
        model=ModelSpec.model_validate(stored["model"]),
        space=space_from_definition(stored["space"]),
        world_size=int(stored["world_size"]),
        global_batch=int(stored["global_batch"]),
        objective=Objective.from_dict(stored.get("objective")),
        budget_s=base.budget_s,
        device_memory=stored.get("device_memory"),
        headroom=float(stored.get("headroom") or base.headroom),
        n_trials=base.n_trials,
        baseline=Knobs.model_validate(stored["baseline"]) if stored.get("baseline") else None,
        baseline_source=stored.get("baseline_source"),
        schedule=base.schedule,
        seed=base.seed,
    )


@dataclass
class SearchSummary:
    study_name: str
    run_id: int
    elapsed_s: float
    stop_reason: str
    counts: dict[str, int]
    best: Candidate | None
    baseline: dict[str, Any] | None  # the baseline's probe row, if one was probed
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


ESTIMATE_AUTO_MIN_BUDGET_S = 600.0  # below this, tracing costs too large a share of the budget


def trace_points(space: Space) -> list[tuple[int, int, bool, str]]:
    """The smallest and largest micro batch per (max_length, checkpointing, precision): the estimator scales
    activations linearly in the micro batch and fits the length curve, so these few points cover the space."""
    micros = sorted({min(space.micro_batch_size), max(space.micro_batch_size)})
    return [
        (m, length, ckpt, prec)
        for m in micros
        for length in space.max_length
        for ckpt in space.gradient_checkpointing
        for prec in space.precision
    ]


def build_estimator(request: SearchRequest, timeout_s: float) -> tuple[EstimatorLike | None, str]:
    """tuner.estimator's fake-tensor trace of the model (a subprocess), or None with the reason it is unavailable."""
    from tuner.errors import TunerError
    from tuner.estimator import Estimator, trace

    started = time.monotonic()
    try:
        traced = trace(request.model, trace_points(request.space), timeout_s=timeout_s)
    except (TunerError, RuntimeError, OSError) as err:
        return None, f"memory estimate unavailable ({str(err).splitlines()[0] if str(err) else type(err).__name__}); probing without it"
    took = time.monotonic() - started
    return Estimator(traced, world_size=request.world_size), f"memory estimate traced in {took:.0f}s ({traced.param_count:,} params)"


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


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
        if run["status"] != "running" or w_host != host or not pid.isdigit() or worker == me or _pid_alive(int(pid)):
            continue
        cause = f"interrupted: worker {worker} died during the probe (killed); failed on resume by {me}"
        running = {t.number: t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
        for claim in store.worker_claims(name, worker):
            trial = running.get(claim["trial_number"]) if claim["trial_number"] is not None else None
            if trial is not None:
                study._storage.set_trial_user_attr(trial._trial_id, "status", "interrupted")
                study._storage.set_trial_user_attr(trial._trial_id, "cause", cause)
                study.tell(trial.number, state=TrialState.FAIL)
                causes.append(f"trial {trial.number}: {cause}")
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
        self.strategy = Strategy(
            study=self.study,
            space=request.space,
            model=request.model,
            world_size=request.world_size,
            global_batch=request.global_batch,
            objective=request.objective,
            device_memory=request.device_memory,
            headroom=request.headroom,
            schedule=request.schedule,
            baseline=request.baseline,
            n_trials=request.n_trials,
            estimator=estimator,
            seed=request.seed,
        )
        self.probes_run = 0
        self.probe_seconds = 0.0

    def attach_estimator(self, estimator: EstimatorLike | None) -> None:
        self.strategy.estimator = estimator

    def _sync(self) -> None:
        self.strategy.load_rows(self.store.probes(self.request.study_name))

    def _record(self, row: dict[str, Any], run_id: int) -> None:
        self.store.record_probe({**row, "study_name": self.request.study_name, "run_id": run_id})

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
        while root.__cause__ is not None or getattr(root, "orig", None) is not None:  # optuna wraps the driver's error
            root = getattr(root, "orig", None) or root.__cause__  # type: ignore[assignment]
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
        name = self.request.study_name
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
        done = any(
            r["config_key"] == proposal.config_key and r["fidelity"] == proposal.fidelity for r in self.strategy.rows
        )
        if owner is not None and not done and self._stale(owner):
            # the claim of a worker that died mid-probe: take it over
            self.store.release_claim(name, proposal.config_key, proposal.fidelity)
            return self.store.claim(*args)
        return False

    def _stale(self, owner: str) -> bool:
        runs = [r for r in self.store.runs(self.request.study_name) if r["worker"] == owner]
        if not runs or runs[-1]["status"] != "running":
            return True
        beat = runs[-1]["heartbeat_at"]
        if beat is None:
            return True
        if beat.tzinfo is None:  # SQLite hands back naive UTC
            beat = beat.replace(tzinfo=dt.timezone.utc)
        return (dt.datetime.now(dt.timezone.utc) - beat).total_seconds() > STALE_CLAIM_S

    def _why_stopped(self) -> str:
        s = self.strategy
        if s._exhausted:
            return "space exhausted"
        if self.request.n_trials is not None and s.explored >= self.request.n_trials:
            return f"{self.request.n_trials} trials done"
        return "budget"

    def _lost_claim(self, proposal: Proposal) -> None:
        rows = self.store.probes(self.request.study_name)
        done = [r for r in rows if r["config_key"] == proposal.config_key and r["fidelity"] == proposal.fidelity]
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
        rows = self.store.probes(self.request.study_name)
        counts = self.store.count_probes(self.request.study_name)
        base = [r for r in rows if r["fidelity"] == "baseline"]
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
