"""A study's Optuna trials counted by state at the cost of its unfinished tail, not of the whole study.

Optuna refuses every change to a finished trial (``check_trial_is_updatable``: state, values, params and attributes),
and a new trial gets a larger ``trial_id`` than every existing one. So the trials below the smallest id that was
unfinished at the last count (the *watermark*) are counted for good; a later count reads only the trials from the
watermark on (the primary key range within the study's index) and adds them. A study whose trials have all finished
costs a read of the trials added since. A trial left RUNNING by a worker that died keeps the tail from its id on: no
worse than counting them all, which is what the first count does. Each read also counts the study's trials (the
index alone): a trial that appeared below the watermark (PostgreSQL hands out ids before the INSERT commits) makes
the sums disagree, and the study is counted again from its start."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from optuna.trial import TrialState

from tuner.storage.optuna_trials import TRIALS, state_of


@dataclass(frozen=True)
class Tally:
    """Finished trials of id below ``watermark``, counted by state name: what no later write can change."""

    watermark: int = 0
    settled: dict[str, int] = field(default_factory=dict)


def fold(tally: Tally, tail: Iterable[tuple[int, TrialState]]) -> tuple[Tally, dict[str, int]]:
    """(the new tally, the counts by state of every trial) from the old tally and the trials of id >= its watermark.
    Pure: the tail's finished trials below its first unfinished one join the settled counts."""
    rows = sorted(tail)
    unfinished = [tid for tid, state in rows if not state.is_finished()]
    watermark = unfinished[0] if unfinished else (rows[-1][0] + 1 if rows else tally.watermark)
    settled = Counter(tally.settled)
    live: Counter[str] = Counter()
    for tid, state in rows:
        (settled if tid < watermark else live)[state.name] += 1
    counts = settled + live
    return Tally(watermark, dict(settled)), {name: counts[name] for name in sorted(counts)}


class TrialCounts:
    """The per-study tallies of one API process (keyed by Optuna's study id: a study deleted and created again under
    its name gets a new id, and a new tally)."""

    def __init__(self, max_studies: int = 256) -> None:
        self._lock = threading.Lock()
        self._tallies: dict[int, Tally] = {}
        self._max = max_studies

    def counts(self, conn: sa.Connection, sid: int) -> dict[str, int]:
        """Trials of study ``sid`` by state name (COMPLETE, PRUNED, RUNNING ...), as of this read."""
        with self._lock:
            tally = self._tallies.get(sid, Tally())
        tail, total = _tail(conn, sid, tally.watermark)
        if sum(tally.settled.values()) + len(tail) != total:
            # a trial below the watermark that was not there before: on PostgreSQL, an id handed out by the sequence
            # whose INSERT committed after a larger one. Counted again from the start.
            tally = Tally()
            tail, _ = _tail(conn, sid, 0)
        new, counts = fold(tally, tail)
        with self._lock:
            if sid not in self._tallies and len(self._tallies) >= self._max:
                self._tallies.pop(next(iter(self._tallies)))
            current = self._tallies.get(sid)
            if current is None or new.watermark >= current.watermark:  # an older, slower read must not undo a newer
                self._tallies[sid] = new
        return counts


def _tail(conn: sa.Connection, sid: int, watermark: int) -> tuple[list[tuple[int, TrialState]], int]:
    """(the study's trials of id >= ``watermark`` with their states, the study's trial count), in one statement: one
    snapshot, so a trial committed between two reads cannot hide in one and not the other."""
    total = sa.select(sa.func.count()).select_from(TRIALS).where(TRIALS.c.study_id == sid).scalar_subquery()
    rows = conn.execute(
        sa.select(TRIALS.c.trial_id, TRIALS.c.state, total).where(
            TRIALS.c.study_id == sid, TRIALS.c.trial_id >= watermark
        )
    ).all()
    if not rows:
        return [], int(conn.execute(sa.select(total)).scalar_one())
    return [(int(tid), state_of(state)) for tid, state, _ in rows], int(rows[0][2])


def stamp(counts: dict[str, int]) -> tuple[Any, ...]:
    """The counts as a hashable, comparable value (part of a cache version)."""
    return tuple(sorted(counts.items()))


__all__ = ["Tally", "TrialCounts", "fold", "stamp"]
