"""What the API reads of a study's Optuna trials, behind the storage layer: the study's id, its trials counted by state
(tuner.storage.trial_counts: at the cost of the unfinished tail) and one page of them (tuner.storage.optuna_trials:
paged in SQL). One object per reading process: it remembers that Optuna's tables exist, and the per-study tallies."""

from __future__ import annotations

import threading

from sqlalchemy.engine import Engine

from tuner.storage.optuna_trials import PagedTrial, has_optuna_tables, study_id, trial_page
from tuner.storage.trial_counts import TrialCounts


class TrialReads:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._lock = threading.Lock()
        self._tables = False
        self._counts = TrialCounts()

    def study_counts(self, name: str) -> tuple[int | None, dict[str, int]]:
        """(the Optuna study id of ``name``, its trials by state name), in one connection; (None, {}) before a worker
        created the Optuna study (or Optuna's tables)."""
        with self.engine.connect() as conn:
            if not self._tables:
                if not has_optuna_tables(conn):
                    return None, {}
                with self._lock:
                    self._tables = True
            sid = study_id(conn, name)
            return sid, (self._counts.counts(conn, sid) if sid is not None else {})

    def page(self, sid: int | None, offset: int, limit: int, state: str | None = None) -> list[PagedTrial]:
        """The page of study ``sid``'s trials (of ``state``, when given) from ``offset``, in number order."""
        if sid is None:
            return []
        with self.engine.connect() as conn:
            return trial_page(conn, sid, offset, limit, state)


__all__ = ["PagedTrial", "TrialReads"]
