"""tuner.records.run: the search run and claim records as the storage hands them out, and the one stale-worker rule
(SearchRun.is_live: the driver's claim takeover, the API's study status)."""

from __future__ import annotations

import datetime as dt

import pytest

from tuner.records.run import STALE_AFTER_S, Claim, RecordError, RunStatus, SearchRun

NOW = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.timezone.utc)


def run(status: str = "running", beat_age_s: float | None = 5.0) -> SearchRun:
    beat = None if beat_age_s is None else NOW - dt.timedelta(seconds=beat_age_s)
    started = NOW - dt.timedelta(hours=1)
    return SearchRun.from_record(
        {
            "id": 1,
            "study_name": "s",
            "worker": "h:1",
            "status": status,
            "started_at": started,
            "heartbeat_at": beat,
            "deadline_at": None,
        }
    )


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
def test_live_while_running_and_beating(row: SearchRun, live: bool) -> None:
    assert row.is_live(NOW) is live


def test_the_threshold_is_a_parameter() -> None:
    row = run(beat_age_s=30)
    assert row.is_live(NOW, stale_after=60) and not row.is_live(NOW, stale_after=10)
    assert STALE_AFTER_S == 120.0


def test_a_stored_run_is_typed() -> None:
    r = run()
    assert r.status is RunStatus.RUNNING and not r.status.ended and RunStatus.FAILED.ended
    assert (r.id, r.worker, r.started_at, r.deadline_at) == (1, "h:1", NOW - dt.timedelta(hours=1), None)


def test_a_run_with_an_unknown_status_is_a_record_error() -> None:
    with pytest.raises(RecordError, match="search run 1: unknown status 'paused'"):
        run("paused")


def test_a_claim_from_its_columns() -> None:
    c = Claim.from_record(
        {
            "study_name": "s",
            "config_key": "k",
            "fidelity": "short",
            "trial_number": None,
            "worker": "h:2",
            "claimed_at": NOW,
            "id": 7,
        }
    )
    assert (c.config_key, c.fidelity, c.trial_number, c.worker, c.claimed_at) == ("k", "short", None, "h:2", NOW)
