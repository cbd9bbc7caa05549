"""A search run (one `tuner search` process working on a study: tuner_search_runs) and a claim (a worker's hold on
one config and fidelity: tuner_claims), as the storage hands them out, with the one rule for whether a run's worker
is alive.

Liveness: a worker beats (``heartbeat_at``) every ~10 s, during a probe too, from the moment its run starts
(tuner.storage.Store.start_run writes the first beat). So a run is live while it is marked running and its latest beat
is at most ``stale_after`` seconds old. A run marked running with no beat at all was not written by a beating worker:
nothing shows it alive, so it is not live. The driver takes over a dead worker's claims by it; the API's study status
and progress read it."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from tuner.records.ruled_out import RecordError

STALE_AFTER_S = 120.0  # no heartbeat for this long: the worker is gone (killed, host down, cut off)


class RunStatus(str, Enum):
    """Where a search run is: running, or how it ended."""

    RUNNING = "running"
    FINISHED = "finished"
    INTERRUPTED = "interrupted"  # stopped by the user (Ctrl-C), or found dead by a later worker of the study
    FAILED = "failed"  # ended by an exception

    def __str__(self) -> str:
        return self.value

    @property
    def ended(self) -> bool:
        return self is not RunStatus.RUNNING


@dataclass(frozen=True)
class SearchRun:
    id: int
    study_name: str
    worker: str  # host:pid
    status: RunStatus
    started_at: dt.datetime  # aware UTC, as every timestamp below (tuner.storage.utc.UTCDateTime hands them so)
    deadline_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
    heartbeat_at: dt.datetime | None = None
    budget_s: float | None = None
    message: str | None = None  # why it ended ("budget", "converged", an exception's text ...)

    def is_live(self, now: dt.datetime, stale_after: float = STALE_AFTER_S) -> bool:
        """True while the run is marked running and its last heartbeat is at most ``stale_after`` seconds before
        ``now`` (the database's clock: Store.db_now; aware, as the storage's timestamps)."""
        if self.status is not RunStatus.RUNNING or self.heartbeat_at is None:
            return False
        return (now - self.heartbeat_at).total_seconds() <= stale_after

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> SearchRun:
        """A run from its stored columns; RecordError when its status is none of RunStatus's."""
        try:
            status = RunStatus(record["status"])
        except ValueError:
            raise RecordError(f"search run {record.get('id')}: unknown status {record['status']!r}") from None
        return cls(
            id=int(record["id"]),
            study_name=str(record["study_name"]),
            worker=str(record["worker"]),
            status=status,
            started_at=record["started_at"],
            deadline_at=record.get("deadline_at"),
            finished_at=record.get("finished_at"),
            heartbeat_at=record.get("heartbeat_at"),
            budget_s=record.get("budget_s"),
            message=record.get("message"),
        )


@dataclass(frozen=True)
class Claim:
    """``worker`` holds (config_key, fidelity) of the study: no other worker probes it meanwhile."""

    study_name: str
    config_key: str
    fidelity: str  # tuner.records.Fidelity's value
    trial_number: int | None
    worker: str
    claimed_at: dt.datetime  # aware UTC

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Claim:
        trial = record.get("trial_number")
        return cls(
            study_name=str(record["study_name"]),
            config_key=str(record["config_key"]),
            fidelity=str(record["fidelity"]),
            trial_number=int(trial) if trial is not None else None,
            worker=str(record["worker"]),
            claimed_at=record["claimed_at"],
        )


__all__ = ["STALE_AFTER_S", "Claim", "RecordError", "RunStatus", "SearchRun"]
