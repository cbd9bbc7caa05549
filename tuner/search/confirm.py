"""The confirm phase: which stable configs (finalists) are re-probed longer before one is handed to the user.

Pure: over the ranked candidates of tuner.search.selection. The top ``Schedule.finalists`` are confirmed; beyond them,
a config whose upper bound still reaches the best confirmed one's lower bound (measurements too noisy to tell them
apart) is confirmed too, up to ``Schedule.max_finalists`` confirmed in all.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from tuner.records import Candidate, ProbeRow
from tuner.search.schedule import Schedule
from tuner.search.selection import candidates


def next_finalist(found: Sequence[Candidate], claimed: Collection[str], schedule: Schedule) -> Candidate | None:
    """The next unconfirmed candidate to re-probe longer, or None when the confirm phase is done. ``found``: the
    candidates best first (tuner.search.selection.candidates); ``claimed``: config keys already being confirmed."""
    confirmed = [c for c in found if c.confirmed]
    best_confirmed = max((c.score for c in confirmed), default=None)
    for rank, cand in enumerate(c for c in found if not c.confirmed):
        if cand.config_key in claimed:
            continue
        within_top = rank < schedule.finalists and len(confirmed) < schedule.finalists
        contender = (
            best_confirmed is not None and cand.upper > best_confirmed and len(confirmed) < schedule.max_finalists
        )
        if not within_top and not contender and (best_confirmed is None or cand.score <= best_confirmed):
            return None
        return cand
    return None


def pending(found: Sequence[Candidate], schedule: Schedule) -> int:
    """How many finalists still wait for their confirm probe (the explore phase keeps budget for them)."""
    return len([c for c in found if not c.confirmed][: schedule.finalists])


class Finalists:
    """The confirm phase of one search: the finalists this worker has claimed (each is confirmed once)."""

    def __init__(self, schedule: Schedule) -> None:
        self.schedule = schedule
        self.claimed: set[str] = set()

    def pending(self, rows: Sequence[ProbeRow]) -> int:
        """How many finalists of ``rows`` still wait for their confirm probe."""
        return pending(candidates(rows), self.schedule)

    def claim_next(self, rows: Sequence[ProbeRow]) -> Candidate | None:
        """The next finalist to confirm (now claimed), or None when the confirm phase is done."""
        cand = next_finalist(candidates(rows), self.claimed, self.schedule)
        if cand is not None:
            self.claimed.add(cand.config_key)
        return cand
