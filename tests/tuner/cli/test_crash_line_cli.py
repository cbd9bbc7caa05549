"""Issue 21 §3 from a stored study: a study created with data keeps its lengths' summary (and the estimate's trace),
and `tuner trials`, `tuner best --changes` and `tuner report` say when the baseline would crash on that data and that
the pick fits its worst batch: the one crash line (tuner.session.crash_line), rebuilt from the storage alone."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from optuna.distributions import IntDistribution

from tests.helpers.sample_storage import SampleStudy
from tests.helpers.seq2seq_data import long_tail_lengths
from trials.contract import Knobs, ProbeConfig, ProbeResult, RankMemory, StepStats
from tuner.job.definition import Job
from tuner.job.length_summary import DataOrigin, LengthSummary
from tuner.job.lengths import SampleLengths
from tuner.memory.estimator import Estimator
from tuner.memory.trace import Trace, TracePoint

MiB = 1 << 20
CAPACITY = 16 * MiB
WORLD = 2
GLOBAL_BATCH = 16


def _trace(lengths: list[int]) -> Trace:
    """Activations that grow as attention does: per sample 1 KiB x L + 16 B x L^2."""
    points = [
        TracePoint(micro_batch_size=2, max_length=n, activation_bytes=2 * (1024 * n + 16 * n * n)) for n in lengths
    ]
    return Trace(param_count=1000, param_bytes=4000, largest_param=100, points=points)


def _result(peak: int | None) -> ProbeResult:
    ok = peak is not None
    ranks = [
        RankMemory(rank=r, peak_allocated=peak or 0, peak_reserved=peak or 0, capacity=CAPACITY) for r in range(WORLD)
    ]
    steps = StepStats(micro_mean_s=0.1, micro_p50_s=0.1, micro_max_s=0.1, optimizer_step_s=0.1, cycle_s=0.2)
    return ProbeResult.model_validate(
        {
            "status": "ok" if ok else "oom",
            "cause": None if ok else "torch.OutOfMemoryError: emulated device of 16 MiB exhausted",
            "samples_per_s": 40.0 if ok else None,
            "steps": steps if ok else None,
            "ranks": ranks if ok else [],
            "capacity": CAPACITY,
            "wall_s": 6.0,
            "setup_s": 3.0,
        }
    )


@pytest.fixture
def study(tmp_path: Path) -> str:
    """A seq2seq study on a long-tailed set (1 sample in 50 of 300-400 words): the baseline (micro 8) fits its
    typical batches but not the worst and OOMed at it, the pick (micro 2) is measured stable at the worst."""
    url = f"sqlite:///{tmp_path}/t.db"
    inputs = long_tail_lengths(400) + 1
    lengths = SampleLengths.of(inputs, [5] * len(inputs))
    longest = int(inputs.max())
    job = Job(precision="fp32", max_length=longest, max_target_length=5)
    summary = LengthSummary.of(lengths, DataOrigin(str(tmp_path / "data.jsonl"), "train", "source", "target"))
    trace = _trace([40, longest])
    definition = {
        "model": {"source": "builtin:tiny-t5"},
        "job": job.model_dump(mode="json"),
        "world_size": WORLD,
        "global_batch": GLOBAL_BATCH,
        "device_memory": CAPACITY,
        "headroom": 0.9,
        "data": summary.to_json(),
        "trace": trace.model_dump(mode="json"),
    }
    sample = SampleStudy(url, "data", definition, {"micro_batch_size": IntDistribution(1, 8)}, worker="host:1")
    estimator = Estimator(trace, world_size=WORLD, global_batch=GLOBAL_BATCH)
    for trial, fidelity, micro in ((0, "baseline", 8), (1, "short", 2)):
        knobs = Knobs(micro_batch_size=micro, max_length=longest, zero_stage=0)
        peak = estimator.predict(knobs).raw
        accum = GLOBAL_BATCH // (micro * WORLD)
        config = ProbeConfig(knobs=knobs, world_size=WORLD, gradient_accumulation_steps=accum, device_memory=CAPACITY)
        result = _result(peak if peak <= CAPACITY else None)
        row = sample.probe(config, result, trial_number=trial, config_key=f"k{micro}", fidelity=fidelity)
        sample.trial({"micro_batch_size": micro}, row.status.value, row.objective, row.cause)
    sample.finish()
    return url


def _tuner(monkeypatch, capsys, *args: str) -> str:
    from tuner.cli import main as tuner_main

    monkeypatch.setenv("COLUMNS", "400")
    monkeypatch.setattr(sys, "argv", ["tuner", *args])
    tuner_main()  # returns on success
    out = capsys.readouterr()
    assert "Traceback" not in out.err, out.err
    return out.out


def test_trials_best_and_report_say_when_the_baseline_crashes_on_the_stored_data(
    study: str, monkeypatch, capsys, tmp_path: Path
) -> None:
    trials = _tuner(monkeypatch, capsys, "trials", "--study", "data", "--storage", study, "--wide")
    assert "your data: 400 samples of " in trials and "data.jsonl [train]" in trials
    baseline = next(line for line in trials.splitlines() if line.startswith("trial 0 (your config) on your data: "))
    assert "1 batch in " in baseline and "needs more than 16.0 MiB" in baseline
    assert "with shuffling your run crashes after about " in baseline and "(median; 90% within " in baseline
    assert "the estimate traced inputs of 40, " in baseline and "calibrated on 1 measured probe at " in baseline
    assert "extrapolated beyond the traced ones; stored data: lengths stored exactly" in baseline
    assert "trial 1 on your data" not in trials  # the pick fits every batch: nothing to warn of
    piped = _tuner(monkeypatch, capsys, "trials", "--study", "data", "--storage", study).splitlines()
    column = piped[0].split("\t").index("on your data")  # piped, each row's crash line is a column
    assert [row.split("\t")[column] for row in piped[1:] if row.startswith("0 baseline")] == [baseline]

    changes = _tuner(monkeypatch, capsys, "best", "--changes", "--study", "data", "--storage", study)
    assert "your config (trial 0) on your data: 1 batch in " in changes
    pick = next(line for line in changes.splitlines() if line.startswith("the pick on your data: "))
    assert "every batch fits in 16.0 MiB (the worst, 2 x " in pick and " needs " in pick

    _tuner(monkeypatch, capsys, "report", "--study", "data", "--storage", study, "-o", str(tmp_path / "r.html"))
    page = (tmp_path / "r.html").read_text()
    assert "On your data: when a config would crash" in page
    assert (
        "your config (trial 0) on your data: 1 batch in " in page and "the pick on your data: every batch fits" in page
    )


def test_the_trace_is_kept_with_a_study_that_has_data_once(tmp_path: Path) -> None:
    """The first worker's trace is recorded in the definition (less its largest allocations), only with data."""
    from tuner.memory.trace import TracedAllocation
    from tuner.session.crash_line import keep_trace
    from tuner.storage import Store

    store = Store(f"sqlite:///{tmp_path}/k.db")
    big = TracedAllocation(op="aten.bmm", shape=[2, 4, 40, 40], dtype="float32", nbytes=51200)
    trace = _trace([40, 80])
    trace.points[0].largest = {"train": [big]}
    summary = LengthSummary.of(SampleLengths.of([5, 40]), DataOrigin("d"))
    store.ensure_study("with", {"world_size": 1, "data": summary.to_json()})
    store.ensure_study("without", {"world_size": 1})
    keep_trace(store, "with", trace)
    keep_trace(store, "without", trace)
    kept = store.require_definition("with").trace
    assert kept is not None and [p["max_length"] for p in kept["points"]] == [40, 80]
    assert all(p["largest"] == {} for p in kept["points"])
    assert store.require_definition("without").trace is None
    keep_trace(store, "with", _trace([7]))  # a later worker's: the first one stays
    assert [p["max_length"] for p in store.require_definition("with").trace["points"]] == [40, 80]


def test_a_row_whose_stored_knobs_are_no_config_gets_a_line_saying_so(study: str) -> None:
    from tuner.session.crash_line import study_crash
    from tuner.storage import Store

    store = Store(study)
    crash = study_crash(store.require_definition("data"), store.probes("data"))
    assert crash is not None
    line = crash.shown({"micro_batch_size": "many"}, "trial 9", always=True)
    assert line == "trial 9 on your data: no crash estimate (its stored knobs are not a config this tuner reads)"
    assert crash.shown({"micro_batch_size": "many"}, "trial 9") is None


def test_a_live_search_prints_the_crash_line_under_the_baselines_row(study: str) -> None:
    """`tuner search`'s stream: under the baseline's row, the line `tuner trials` prints (one function); not under
    another probe's, and none for a study without data."""
    import io
    import types

    from rich.console import Console

    from tuner.cli.progress import LiveProgress
    from tuner.cli.search import baseline_crash
    from tuner.job.objective import Objective
    from tuner.search.strategy import Outcome, Proposal
    from tuner.session.crash_line import study_crash
    from tuner.storage import Store
    from tuner.units import Deadline

    store = Store(study)
    rows = {r.fidelity.value: r for r in store.probes("data")}
    request = types.SimpleNamespace(data=object(), storage=study, study_name="data")
    out = io.StringIO()
    console = Console(file=out, width=1000, color_system=None)
    progress = LiveProgress(console, Deadline(60), Objective(), "data", crash=baseline_crash(request))  # type: ignore[arg-type]
    for fidelity in ("baseline", "short"):
        row = rows[fidelity]
        config = ProbeConfig.model_validate(row.config)
        proposal = Proposal(config=config, fidelity=row.fidelity, config_key=row.config_key, trial=None, expected_s=6)
        progress.started(proposal)
        progress.finished(proposal, Outcome(row=row, state=None, objective=row.objective, stable=row.stable))
    progress._flush()
    lines = out.getvalue().splitlines()
    crash = study_crash(store.require_definition("data"), store.probes("data"))
    assert crash is not None
    expected = crash.line(rows["baseline"].knobs, "your config")
    assert expected.startswith("your config on your data: 1 batch in ")
    at = next(i for i, line in enumerate(lines) if "(baseline)" in line)
    assert lines[at + 1] == f"  {expected}"
    assert sum("on your data" in line for line in lines) == 1  # the short probe's row: no line
    assert baseline_crash(types.SimpleNamespace(data=None)) is None  # type: ignore[arg-type]
