"""Caches the best config of each study until its probe rows change.

Probe rows are insert-only (Store.record_probe), so (row count, highest id) of a study identifies its content: one
indexed aggregate per request instead of loading and ranking every row. A new probe invalidates the entry at once, so
a client never sees a stale best config."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

import sqlalchemy as sa

from tuner.storage import Store
from tuner.storage.schema import probes

Version = tuple[int, int | None]
T = TypeVar("T")


def probe_version(store: Store, study: str) -> Version:
    q = sa.select(sa.func.count(), sa.func.max(probes.c.id)).where(probes.c.study_name == study)
    with store.engine.connect() as conn:
        count, top = conn.execute(q).one()
    return int(count), top


class BestConfigCache:
    def __init__(self, max_entries: int = 256) -> None:
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, str], tuple[Version, Any]] = {}
        self._max = max_entries
        self._flights: dict[tuple[str, str], threading.Lock] = {}

    def get(self, store: Store, study: str, fmt: str, compute: Callable[[], T]) -> T:
        """``compute()`` for (study, fmt), reused while the study's probe rows stay the same (fmt names what is
        cached: an export format, or "best-so-far" for GET /studies/{name}). One request computes a missing entry
        while the others for the same key wait for it: 100 clients arriving at a cold 10,000-row study would
        otherwise each load every row at once and hold every pooled connection."""
        version = probe_version(store, study)
        key = (study, fmt)
        hit = self._hit(key, version)
        if hit is not None:
            return hit[1]
        with self._lock:
            flight = self._flights.setdefault(key, threading.Lock())
        with flight:
            hit = self._hit(key, version)
            if hit is not None:
                return hit[1]
            out = compute()  # raises (404, 503 ...) without caching anything
            with self._lock:
                if len(self._entries) >= self._max:
                    self._entries.pop(next(iter(self._entries)))
                self._entries[key] = (version, out)
        return out

    def _hit(self, key: tuple[str, str], version: Version) -> tuple[Version, Any] | None:
        with self._lock:
            hit = self._entries.get(key)
        return hit if hit is not None and hit[0] == version else None
