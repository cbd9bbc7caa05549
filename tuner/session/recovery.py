"""A worker's start on a study: the Optuna study opened, and what gone workers left recovered before any probe.

A worker of this host that died (kill -9, the OOM killer, a lost database) may have left rows in its local journal
that never reached the database, a RUNNING trial whose row is stored but that Optuna was never told about, and claims
that block configs. ``replay_journals`` stores the journals' rows and tells their trials; ``reap_dead_local_workers``
closes the dead workers' runs now (not after the heartbeat grace period) and releases their claims; ``recover`` runs
them in their order, then fails the trials left RUNNING without a heartbeat. The session (tuner.session.session)
calls it as an explicit step before it builds the driver, whose constructor does no I/O.
"""

from __future__ import annotations

import contextlib
import os
import socket
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from tuner.probing.forkserver import pid_alive
from tuner.records import ProbeRow, ProbeStatus
from tuner.records.run import RunStatus
from tuner.search.sampling import make_sampler
from tuner.search.study import retell, set_user_attr, trial_id
from tuner.storage import Store, optuna_storage
from tuner.storage.journal import journals, read_entries, read_stop, safe_part, write_entries


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def open_study(name: str, url: str, seed: int | None, *, fail_stale: bool = True) -> optuna.Study:
    with warnings.catch_warnings():  # heartbeats and fail_stale_trials are "experimental" in optuna 5
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        storage = optuna_storage(url)
        study = optuna.create_study(
            study_name=name, storage=storage, direction="maximize", sampler=make_sampler(seed), load_if_exists=True
        )
        if fail_stale:
            fail_stale_trials(study)
    return study


def fail_stale_trials(study: optuna.Study) -> None:
    """RUNNING trials whose heartbeat stopped (a killed worker's) become FAIL."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


def _tell_from_row(study: optuna.Study, number: int, row: ProbeRow, headroom: float) -> bool:
    """Tells the RUNNING trial ``number`` what its stored row measured (its worker died between storing the row and
    telling Optuna). False when the trial is not running (already told, or failed as stale)."""
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    match = [t for t in running if t.number == number]
    if not match:
        return False
    retell(study, optuna.trial.Trial(study, trial_id(match[0])), row, headroom)
    return True


def _stored_rows_by_trial(store: Store, name: str) -> dict[int, ProbeRow]:
    return {r.trial_number: r for r in store.probes(name) if r.trial_number is not None and r.measured}


def replay_journals(store: Store, study: optuna.Study, folder: Any, me: str, headroom: float) -> int:
    """Stores the rows the journals of this host's gone workers (and this worker's) still hold for the study, and
    tells their trials still RUNNING; returns the rows stored now. Idempotent: a row already stored is skipped."""
    host = safe_part(socket.gethostname())
    name = study.study_name
    stored = 0
    for path, w_host, pid in journals(folder, name):
        if w_host != host or (pid is not None and pid != os.getpid() and pid_alive(pid)):
            continue  # another host's journal, or a live worker's: it stores its own rows
        entries = read_entries(path)
        for entry in entries:
            row = ProbeRow.from_record(entry.record)
            before = store.probe_id(entry.uid)
            store.record_probe(row, entry.uid)
            stored += before is None
            if row.trial_number is not None and row.measured:
                _tell_from_row(study, row.trial_number, row, headroom)
        with contextlib.suppress(OSError):  # a read-only place keeps the file: its rows are stored, a replay skips them
            write_entries(path, [])
    return stored


def stop_causes(folders: Sequence[Path], study: str) -> dict[int, str]:
    """Why each gone worker of this host stopped, by pid, where it left a stop line (a storage error it stopped on)."""
    host = safe_part(socket.gethostname())
    causes: dict[int, str] = {}
    for folder in folders:
        for path, w_host, pid in journals(folder, study):
            cause = read_stop(path) if w_host == host and pid is not None else None
            if cause and pid is not None:
                causes[pid] = cause
    return causes


def reap_dead_local_workers(
    store: Store, study: optuna.Study, me: str, headroom: float = 1.0, stops: dict[int, str] | None = None
) -> list[str]:
    """Closes the runs of workers on this host whose process is gone (kill -9, the OOM killer, a stop on a storage
    error) now, instead of after the heartbeat grace period: each RUNNING trial they claimed is told from its stored
    row where the worker died after storing it, else fails with the cause (``stops``: the one a worker left, by pid;
    else "killed"); their claims are released. Returns the causes recorded."""
    host = socket.gethostname()
    name = study.study_name
    causes: list[str] = []
    for run in store.runs(name):
        worker = run.worker
        w_host, _, pid = worker.rpartition(":")
        if (
            run.status is not RunStatus.RUNNING
            or w_host != host
            or not pid.isdigit()
            or worker == me
            or pid_alive(int(pid))
        ):
            continue
        stop = (stops or {}).get(int(pid))
        how = f"stopped on a storage error ({stop})" if stop else "died during the probe (killed)"
        cause = f"interrupted: worker {worker} {how}; failed on resume by {me}"
        running = {t.number: t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
        claimed = store.worker_claims(name, worker)
        # its trials: the ones it claimed, and the ones it asked for but was killed before claiming
        mine = {c.trial_number for c in claimed} | {
            n for n, t in running.items() if t.user_attrs.get("worker") == worker
        }
        rows = _stored_rows_by_trial(store, name)
        for number in sorted(n for n in mine if n in running):
            trial = running[number]
            if number in rows:  # it died after storing the row, before telling Optuna: the measurement stands
                _tell_from_row(study, number, rows[number], headroom)
                continue
            set_user_attr(study, trial, "status", ProbeStatus.INTERRUPTED.value)
            set_user_attr(study, trial, "cause", cause)
            study.tell(trial.number, state=TrialState.FAIL)
            causes.append(f"trial {trial.number}: {cause}")
        for claim in claimed:
            store.release_claim(name, claim.config_key, claim.fidelity, worker)
        store.finish_run(run.id, RunStatus.INTERRUPTED, cause)
    return causes


@dataclass(frozen=True)
class Recovered:
    """What a worker's start recovered of gone workers: journaled rows stored now, and the trials it failed."""

    replayed: int
    reaped: list[str]


def recover(store: Store, study: optuna.Study, folders: Path | Sequence[Path], me: str, headroom: float) -> Recovered:
    """Before this worker's first proposal: the order matters, a gone worker's journaled rows (in every place a
    journal may be, tuner.storage.journal.journal_places) are stored and told first, then its other trials fail with
    the cause it left or "killed", then any trial left RUNNING without a heartbeat."""
    places = [folders] if isinstance(folders, Path) else list(folders)
    stops = stop_causes(places, study.study_name)
    replayed = sum(replay_journals(store, study, folder, me, headroom) for folder in places)
    reaped = reap_dead_local_workers(store, study, me, headroom, stops)
    fail_stale_trials(study)
    return Recovered(replayed, reaped)
