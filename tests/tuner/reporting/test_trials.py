"""tuner.reporting.trials: the one join of Optuna trials with probe rows (`tuner trials`, GET /studies/{name}/trials).
Pure: plain objects in, records out; milliseconds."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from trials.contract import Status
from tuner.records import ProbeRow
from tuner.reporting.trials import TrialRecord, join_trials, trial_cause


class State(Enum):
    COMPLETE = 1
    PRUNED = 2
    FAIL = 3
    RUNNING = 4


@dataclass
class Trial:  # the shape of optuna.trial.FrozenTrial the join reads
    number: int
    state: State
    params: dict[str, Any] = field(default_factory=dict)
    values: list[float] | None = None
    user_attrs: dict[str, Any] = field(default_factory=dict)


def row(id: int, trial: int | None, fidelity: str = "short", status: str = "ok", **kw: Any) -> ProbeRow:
    return ProbeRow.from_record(
        {
            "result": {},  # a measured ok row has its result (ProbeRow's invariant)
            "id": id,
            "config_key": f"k{id}",
            "trial_number": trial,
            "fidelity": fidelity,
            "status": status,
            "knobs": {"m": id},
            "peak_allocated": 1 if status == "ok" and fidelity != "inferred" else None,
            **kw,
        }
    )


def test_rows_attach_to_their_trial_oldest_first_and_the_latest_measures() -> None:
    trials = [Trial(0, State.COMPLETE, {"m": 4}, [20.0], {"fidelity": "short", "samples_per_s": 99.0})]
    rows = [
        row(7, 0, "confirm", samples_per_s=19.0, objective=19.0, peak_allocated=121, stable=True, probe_seconds=9.0),
        row(3, 0, samples_per_s=20.0, objective=20.0, peak_allocated=120, stable=True, probe_seconds=6.0),
        row(5, None, "confirm", samples_per_s=1.0),  # a confirm probe of no trial: not joined
    ]
    [rec] = join_trials(trials, rows)
    assert isinstance(rec, TrialRecord)
    assert [p.id for p in rec.probes] == [3, 7] and rec.latest is not None and rec.latest.id == 7
    assert (rec.number, rec.state, rec.params, rec.value) == (0, "COMPLETE", {"m": 4}, 20.0)
    assert (rec.samples_per_s, rec.objective, rec.peak_allocated, rec.stable) == (19.0, 19.0, 121, True)
    assert (rec.fidelity, rec.status, rec.cause, rec.probe_seconds) == ("short", "ok", None, 9.0)
    assert rec.knobs == {"m": 7}


def test_the_probe_rows_measured_cause_wins_over_what_optuna_was_told() -> None:
    told = {"cause": "told optuna", "status": "oom"}
    trials = [Trial(1, State.PRUNED, user_attrs=told)]
    rows = [row(1, 1, status="oom", cause="torch.OutOfMemoryError: emulated device of 160 MiB exhausted")]
    assert join_trials(trials, rows)[0].cause == "torch.OutOfMemoryError: emulated device of 160 MiB exhausted"


def test_without_a_measured_cause_the_told_one_then_the_bare_status() -> None:
    assert trial_cause({"cause": "interrupted: worker h:1 died"}, None) == "interrupted: worker h:1 died"
    assert trial_cause({"cause": "told"}, row(1, 1, status="timeout", cause=None)) == "told"
    assert trial_cause({}, row(1, 1, status="timeout", cause="")) == "timeout"
    assert trial_cause({}, row(1, 1, status="ok")) is None
    assert trial_cause({}, None) is None


def test_a_trial_without_rows_shows_what_optuna_was_told() -> None:
    attrs = {
        "status": "ok",
        "objective": 30.0,
        "samples_per_s": 30.0,
        "peak_allocated": 150,
        "stable": False,
        "knobs": {"m": 8},
        "reused_from": 3,
        "fidelity": "short",
    }
    [reused, running] = join_trials(
        [Trial(4, State.COMPLETE, values=[30.0], user_attrs=attrs), Trial(5, State.RUNNING)], []
    )
    assert (reused.status, reused.samples_per_s, reused.peak_allocated, reused.stable) == ("ok", 30.0, 150, False)
    assert (reused.knobs, reused.reused_from, reused.probe_seconds, reused.probes) == ({"m": 8}, 3, None, ())
    assert (running.state, running.status, running.cause, running.fidelity, running.latest) == (
        "RUNNING",
        None,
        None,
        "",
        None,
    )


def test_fidelity_falls_back_to_the_first_probe_and_order_follows_the_trials() -> None:
    trials = [Trial(2, State.FAIL), Trial(0, State.COMPLETE)]
    rows = [row(1, 0, "baseline"), row(2, 2, "inferred", status="inferred-oom", cause="inferred-oom: like trial 1")]
    recs = join_trials(trials, rows)
    assert [r.number for r in recs] == [2, 0]
    assert [r.fidelity for r in recs] == ["inferred", "baseline"]
    assert recs[0].cause == "inferred-oom: like trial 1"


def test_a_trial_told_skipped_or_interrupted_has_that_status_of_the_one_enum() -> None:
    [skipped, interrupted, odd] = join_trials(
        [
            Trial(1, State.FAIL, user_attrs={"status": "skipped"}),
            Trial(2, State.FAIL, user_attrs={"status": "interrupted"}),
            Trial(3, State.FAIL, user_attrs={"status": "no-such-status"}),
        ],
        [],
    )
    assert (skipped.status, interrupted.status, odd.status) == (Status.SKIPPED, Status.INTERRUPTED, None)
