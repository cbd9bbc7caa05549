"""Caches what the API builds from a study (its best config, its best so far and probe counts, its trial pages) until
what it was built from changes.

Probe rows are insert-only (Store.record_probe), so (row count, highest id) of a study identifies its content
(Store.probe_version): one indexed aggregate per request instead of loading and ranking every row. A trial page adds
the study's trial counts by state (tuner.storage.trial_counts) to that version, and is kept only when every trial on
it has finished (Optuna refuses any change to a finished trial). A new probe row or trial changes the version, so a
client never sees a stale answer: the next read recomputes it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from tuner.storage import Store

T = TypeVar("T")


def _always(_: object) -> bool:
    return True


class StudyCache:
    def __init__(self, max_entries: int = 256) -> None:
        self._lock = threading.Lock()
        # key -> (version, value, kept): a value not kept marks "computed at this version but not reusable"
        self._entries: dict[tuple[str, str], tuple[Hashable, Any, bool]] = {}
        self._max = max_entries
        self._flights: dict[tuple[str, str], threading.Lock] = {}

    def get(
        self,
        store: Store,
        study: str,
        what: str,
        compute: Callable[[], T],
        *,
        version: Hashable | None = None,
        keep: Callable[[T], bool] = _always,
    ) -> T:
        """``compute()`` for (study, what), reused while ``version`` stays the same (default: the study's probe
        rows, Store.probe_version); ``what`` names what is cached: an export format, "summary" for GET
        /studies/{name}, a page. A result ``keep`` refuses is not reused (a page with a running trial on it): later
        requests at that version compute their own, side by side. One request computes a missing entry while the
        others for the same key wait for it: 100 clients arriving at a cold 10,000-row study would otherwise each load
        every row at once and hold every pooled connection."""
        version = store.probe_version(study) if version is None else version
        key = (study, what)
        hit = self._hit(key, version)
        if hit is not None:
            return hit[1] if hit[2] else compute()
        with self._lock:
            flight = self._flights.setdefault(key, threading.Lock())
        with flight:
            hit = self._hit(key, version)
            if hit is not None and hit[2]:
                return hit[1]
            out = compute()  # raises (404, 503 ...) without caching anything
            with self._lock:
                if key not in self._entries and len(self._entries) >= self._max:
                    gone = next(iter(self._entries))
                    self._entries.pop(gone)
                    self._flights.pop(gone, None)
                kept = keep(out)
                self._entries[key] = (version, out if kept else None, kept)
        return out

    def _hit(self, key: tuple[str, str], version: Hashable) -> tuple[Hashable, Any, bool] | None:
        with self._lock:
            hit = self._entries.get(key)
        return hit if hit is not None and hit[0] == version else None
