"""tuner.storage.liveness.run_is_live: the one stale-worker rule (driver claim takeover, API study status)."""

from __future__ import annotations

import datetime as dt

import pytest

from tuner.storage.liveness import STALE_AFTER_S, run_is_live

NOW = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.timezone.utc)


def run(status: str = "running", beat_age_s: float | None = 5.0) -> dict:
    beat = None if beat_age_s is None else NOW - dt.timedelta(seconds=beat_age_s)
    return {"status": status, "heartbeat_at": beat, "deadline_at": None}


@pytest.mark.parametrize(
    ("row", "live"),
    [
        (run(), True),
        (run(beat_age_s=STALE_AFTER_S), True),  # the boundary still counts as beating
        (run(beat_age_s=STALE_AFTER_S + 1), False),
        (run(beat_age_s=None), False),  # nothing shows it alive
        (run("finished"), False),
        (run("interrupted"), False),
        (run("failed", beat_age_s=0), False),
    ],
)
def test_live_while_running_and_beating(row: dict, live: bool) -> None:
    assert run_is_live(row, NOW) is live


def test_the_threshold_is_a_parameter() -> None:
    row = run(beat_age_s=30)
    assert run_is_live(row, NOW, stale_after=60) and not run_is_live(row, NOW, stale_after=10)
    assert STALE_AFTER_S == 120.0
