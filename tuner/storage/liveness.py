"""Whether a search run's worker is alive: the one rule for taking over a dead worker's claims (tuner.session.driver)
and for a study's status and progress in the API (api.views). Pure.

A worker beats (``search_runs.heartbeat_at``) every ~10 s, during a probe too, from the moment its run starts
(tuner.storage.Store.start_run writes the first beat). So a run is live while it is marked running and its latest beat
is at most ``stale_after`` seconds old. A run marked running with no beat at all was not written by a beating worker:
nothing shows it alive, so it is not live.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

STALE_AFTER_S = 120.0  # no heartbeat for this long: the worker is gone (killed, host down, cut off)


def run_is_live(run: Mapping[str, Any], now: dt.datetime, stale_after: float = STALE_AFTER_S) -> bool:
    """True while ``run`` (a search_runs row) is marked running and its last heartbeat is at most ``stale_after``
    seconds before ``now`` (aware, as storage hands every timestamp back: tuner.storage.utc)."""
    if run.get("status") != "running":
        return False
    beat = run.get("heartbeat_at")
    if beat is None:
        return False
    return (now - beat).total_seconds() <= stale_after


__all__ = ["STALE_AFTER_S", "run_is_live"]
