"""The live display's content (rendered to text) and the final summary table."""

import dataclasses
import io
import types

from rich.console import Console

from trials.contract import Knobs, ProbeConfig
from tuner.cli.progress import LiveProgress, brief_cause, compact, probe_line, ruled_out_lines, summary_table
from tuner.job.objective import Objective
from tuner.records import ProbeRow, ProbeStatus
from tuner.search.selection import best_stable
from tuner.search.strategy import Outcome, Proposal
from tuner.session.driver import SearchSummary
from tuner.units import Deadline

MiB = 2**20


def _row(status, objective=None, stable=False, micro=4, **extra):
    return ProbeRow.from_record(
        {
            "result": {},  # a measured ok row has its result (ProbeRow's invariant)
            "id": micro,
            "trial_number": micro,
            "fidelity": "short",
            "config_key": f"k{micro}",
            "knobs": Knobs(micro_batch_size=micro, max_length=128).model_dump(mode="json"),
            "config": {"world_size": 1, "gradient_accumulation_steps": 32 // micro},
            "status": status,
            "cause": "OutOfMemoryError: emulated device" if status == "oom" else None,
            "objective": objective,
            "samples_per_s": objective,
            "peak_allocated": 50 * MiB,
            "capacity": 160 * MiB,
            "stable": stable,
            "probe_seconds": 6.5,
            **extra,
        }
    )


def _proposal(micro):
    config = ProbeConfig(knobs=Knobs(micro_batch_size=micro, max_length=128), gradient_accumulation_steps=32 // micro)
    return Proposal(config=config, fidelity="short", config_key=f"k{micro}", trial=None, expected_s=6.0)


def _numbered(micro, number):
    """A proposal of trial ``number`` (the stream reads only the trial's number)."""
    trial = types.SimpleNamespace(number=number)
    return Proposal(config=_proposal(micro).config, fidelity="short", config_key=f"k{micro}", trial=trial, expected_s=6)


def test_live_panel_counts_ooms_inferred_and_the_best():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=160, color_system=None)
    now = [0.0]
    progress = LiveProgress(console, Deadline(180, clock=lambda: now[0]), Objective(), "demo")
    progress.started(_proposal(4))
    progress.finished(_proposal(4), Outcome(row=_row("ok", 12.5, True), state=None, objective=12.5, stable=True))
    progress.finished(_proposal(32), Outcome(row=_row("oom", micro=32), state=None, objective=None, stable=False))
    why = "inferred-oom from measured micro=32 len=128"
    for micro in (64, 128, 256):
        progress.inferred(_row("inferred-oom", micro=micro, trial_number=micro, fidelity="inferred", cause=why))
    progress.started(_proposal(2))  # the OOM's line, with what it rules out, before the next probe
    now[0] = 60.0
    console.print(progress.__rich__())
    text = out.getvalue()
    assert "OOM-pruned 1" in text and "inferred 3" in text and "stable 1" in text
    assert "best so far: 12.5 samples/s" in text and "time left 2m00s" in text
    oom = next(line for line in text.splitlines() if " oom " in line)
    assert oom.endswith("micro=32 len=128  (rules out 3)") and "ruled out" not in text


def test_a_reason_is_printed_once_then_counted():
    """The OOM's own line counts what it rules out; later configs ruled out by that same OOM are only counted;
    a reason not printed before (an earlier probe's peak over the headroom) gets one line."""
    out = io.StringIO()
    console = Console(file=out, width=200, color_system=None)
    progress = LiveProgress(console, Deadline(180, clock=lambda: 0.0), Objective(), "demo", JOB)
    big = _row("ok", 9.0, False, micro=16)  # over the headroom
    progress.finished(_numbered(16, 7), Outcome(row=big, state=None, objective=9.0, stable=False))
    progress.finished(_numbered(32, 8), Outcome(row=_row("oom", micro=32), state=None, objective=None, stable=False))
    oom_cause, big_cause = "inferred-oom from measured micro=32 len=128", "inferred-oom from measured micro=16 len=128"
    for micro in (64, 128):
        progress.inferred(_row("inferred-oom", micro=micro, fidelity="inferred", cause=oom_cause))
    progress.inferred(_row("inferred-oom", micro=24, fidelity="inferred", cause=big_cause))
    progress.started(_proposal(2))
    progress.finished(
        _numbered(2, 9), Outcome(row=_row("ok", 3.0, True, micro=2), state=None, objective=3.0, stable=True)
    )
    progress.inferred(_row("inferred-oom", micro=256, fidelity="inferred", cause=oom_cause))  # counted only
    progress.started(_proposal(1))
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("trial   7  ok unstable") and lines[0].endswith("micro=16")
    assert lines[1].startswith("trial   8  oom") and lines[1].endswith("micro=32  (rules out 2)")
    assert lines[2] == (
        "ruled out 1 config (micro 24) without running: each needs at least trial 7's memory (over the headroom)"
    )
    assert lines[3].startswith("trial   9  ok") and len(lines) == 4 and progress.quiet == 1


def test_summary_table_shows_best_and_baseline_speedup():
    rows = [_row("ok", 12.5, True, micro=4), _row("ok", 5.0, True, micro=2, fidelity="baseline")]
    summary = SearchSummary(
        study_name="demo",
        run_id=1,
        elapsed_s=100,
        stop_reason="budget",
        counts={"ok": 2},
        best=best_stable(rows),
        baseline=rows[1],
        probes_run=2,
        probe_seconds=13,
        trials=2,
    )
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(summary_table(summary, Objective()))
    text = out.getvalue()
    assert "\n2.50x the throughput of your config (5.00 -> 12.5 samples/s)\n" in text
    assert "12.5 samples/s (one probe; not confirmed)" in text and "micro=4" in text and "accum=8" in text
    assert "the pick: trial 4, micro=4 len=128 accum=8, peak 50.0 MiB of 160.0 MiB" in text
    assert all(len(line) <= 100 for line in text.splitlines()), text
    assert "refused" not in text


def test_summary_table_offers_no_deepspeed_export_for_an_fsdp2_pick():
    row = _row("ok", 12.5, True, micro=4)
    knobs = Knobs(micro_batch_size=4, max_length=128, engine="fsdp2", reshard_after_forward=False)
    rows = [dataclasses.replace(row, knobs=knobs.model_dump(mode="json"))]
    summary = SearchSummary(
        study_name="demo",
        run_id=1,
        elapsed_s=10,
        stop_reason="budget",
        counts={"ok": 1},
        best=best_stable(rows),
        baseline=None,
        probes_run=1,
        probe_seconds=5,
        trials=1,
    )
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(summary_table(summary, Objective()))
    assert "then: tuner export --study demo --format accelerate|hf|env -o FILE" in out.getvalue()
    assert "deepspeed|" not in out.getvalue()


def test_summary_table_counts_refused_configs_apart():
    """A config refused before running (an op that could not be built) is neither an OOM nor a crash of the probe."""
    summary = SearchSummary(
        study_name="demo",
        run_id=1,
        elapsed_s=10,
        stop_reason="budget",
        counts={"ok": 1, "refused": 3},
        best=None,
        baseline=None,
        probes_run=4,
        probe_seconds=5,
        trials=4,
    )
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(summary_table(summary, Objective()))
    assert "0 failed, 3 refused before running (each row says why); 0 ruled out" in out.getvalue()


# -- issue 13: stored and user text is printed as text, never as rich markup ------------------------------------------
HOSTILE = "[/]"


def test_hostile_text_in_knobs_study_names_and_notes_is_printed_verbatim():
    """alloc_conf "[/]" (a study stored before the space checked its syntax), a study named "[/]", a note quoting
    storage text: rich would raise MarkupError (the worker dies) or drop the text; it is printed as it is."""
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=200, color_system=None)
    progress = LiveProgress(console, Deadline(60, clock=lambda: 0.0), Objective(), f"study{HOSTILE}")
    row = _row("ok", 12.5, True, alloc_conf=None)
    row = ProbeRow.from_record({**row.to_record(), "id": 1, "knobs": {**row.knobs, "alloc_conf": HOSTILE}})
    progress.finished(_proposal(4), Outcome(row=row, state=None, objective=12.5, stable=True))
    progress.note(f"storage unreachable ({HOSTILE}[bold]x[/bold]); retrying with backoff")
    console.print(progress.__rich__())
    summary = SearchSummary(
        study_name=f"demo{HOSTILE}",
        run_id=1,
        elapsed_s=10,
        stop_reason=f"budget {HOSTILE}",
        counts={"ok": 1},
        best=best_stable([row]),
        baseline=None,
        probes_run=1,
        probe_seconds=6,
        trials=1,
    )
    console.print(summary_table(summary, Objective()))
    text = out.getvalue()
    assert f"alloc_conf={HOSTILE}" in text  # the probe line, the best so far and the summary's best config
    assert text.count(f"alloc_conf={HOSTILE}") >= 3, text
    assert f"tuner search: study{HOSTILE}" in text and f"study demo{HOSTILE}: budget {HOSTILE}" in text
    assert f"({HOSTILE}[bold]x[/bold])" in text


# -- issue 14: a stream that fits a terminal (the quick start <= 80 lines) -------------------------------------------
EMULATED = (
    "OutOfMemoryError: emulated device out of memory: tried to allocate 190.73 MiB with 2.03 MiB live of 160.00 MiB"
)
CUDA = (
    "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of "
    "which 1.20 GiB is free."
)
JOB = {"precision": "fp32", "max_length": 128, "eval_batch_size": None, "generate": False}


def test_an_oom_line_names_the_failed_allocation_and_fits_100_columns():
    assert brief_cause(ProbeStatus.OOM, EMULATED) == "alloc 190.73 MiB"
    assert brief_cause(ProbeStatus.OOM, CUDA) == "alloc 2.00 GiB"
    assert brief_cause(ProbeStatus.OOM, "killed by a signal") == "out of memory"
    assert brief_cause(ProbeStatus.ERROR, "RuntimeError: NCCL error in: a very long message\nmore") == (
        "RuntimeError: NC\u2026"
    )
    knobs = Knobs(
        micro_batch_size=8,
        max_length=128,
        zero_stage=1,
        allgather_bucket_size=10**7,
        reduce_bucket_size=10**7,
        offload_optimizer=True,
    ).model_dump(mode="json")
    row = _row("oom", micro=8, cause=EMULATED, knobs=knobs, peak_allocated=155 * MiB, probe_seconds=23.3)
    line = probe_line(12, "short", row, "samples/s", JOB)
    assert line.startswith("trial  12  [yellow]oom") and "alloc 190.73 MiB" in line and "peak 155.0 MiB" in line
    plain = line.replace("[yellow]", "").replace("[/]", "")
    assert plain.endswith("micro=8 z1 buckets=1e7 offload") and "len=128" not in plain  # the job is not repeated
    assert len(plain) <= 100, plain
    confirm = probe_line(None, "confirm", _row("ok", 16.9, True, micro=8), "samples/s", JOB)
    assert confirm.startswith("confirm    [green]ok") and "16.9 samples/s" in confirm
    baseline = probe_line(0, "baseline", _row("ok", 5.0, False, micro=2), "samples/s", JOB)
    assert "ok unstable" in baseline and baseline.endswith("micro=2 (baseline)")


def test_compact_labels_merge_equal_buckets_only():
    both = {"micro_batch_size": 4, "max_length": 128, "zero_stage": 2}
    merged = compact({**both, "allgather_bucket_size": 10**7, "reduce_bucket_size": 10**7})
    assert merged == "micro=4 len=128 z2 buckets=1e7"
    assert compact({**both, "allgather_bucket_size": 10**7, "reduce_bucket_size": 5 * 10**7}, JOB) == (
        "micro=4 z2 allgather=1e7 reduce=5e7"
    )


def test_ruled_out_lines_cite_the_oom_by_its_label_without_a_trial_number():
    cause = "inferred-oom from measured micro=8 len=128 zero_stage=3 reduce_bucket_size=50000000"
    rows = [_row("inferred-oom", micro=m, fidelity="inferred", cause=cause) for m in (16, 32)]
    assert ruled_out_lines(rows, JOB) == [
        "ruled out 2 configs (micro 16-32) without running: each needs at least the memory of micro=8 z3 reduce=5e7,"
        " which did not fit"
    ]
    cited = ruled_out_lines(rows, JOB, {"micro=8 z3 reduce=5e7": (10, ProbeStatus.OOM)})[0]  # printed: trial 10
    assert cited.endswith("each needs at least trial 10's memory (an OOM)") and len(cited) <= 100


# -- issue 40 §4: a refusal is the only answer to why a config never ran: whole, once ---------------------------------
REFUSAL = (
    "FSDP2 cannot shard this model: parameter 'shared.weight' is shared by modules accelerate puts in different FSDP "
    "groups (as T5's shared / embed_tokens); untie those weights, or search engine deepspeed"
)


def test_a_refusal_is_printed_whole_under_its_first_probe_then_cited():
    out = io.StringIO()
    console = Console(file=out, width=80, color_system=None)
    progress = LiveProgress(console, Deadline(180, clock=lambda: 0.0), Objective(), "demo", JOB)
    for number, micro in ((0, 1), (1, 2)):
        row = _row("refused", micro=micro, cause=REFUSAL, peak_allocated=None)
        progress.finished(_numbered(micro, number), Outcome(row=row, state=None, objective=None, stable=False))
    progress.started(_proposal(4))
    text = out.getvalue()
    assert "FSD\u2026" not in text and " ".join(text.split()).count(REFUSAL) == 1
    lines = text.splitlines()
    assert "refused" in lines[0] and "reason below" in lines[0] and lines[1].startswith("  \u21b3 FSDP2 cannot shard")
    assert "as above" in lines[-1]


def test_a_study_whose_every_probe_was_refused_ends_with_the_refusals_fix():
    from tuner.session.no_pick import why_no_pick

    rows = [_row("refused", micro=m, cause=REFUSAL, peak_allocated=None) for m in (1, 2, 4)]
    line = why_no_pick(rows)
    assert line == f"every probe was refused before running: {REFUSAL}"
    assert "device-memory" not in line and "budget" not in line
    ooms = why_no_pick([_row("oom", micro=8), *rows[:1]])
    assert ooms.startswith(f"1 probe was refused before running: {REFUSAL}; 1 ran out of device memory: give a")
    assert why_no_pick([]).startswith("no probe has run yet")
    failed = why_no_pick([_row("error", micro=2, cause="RuntimeError: gloo\nconnect failed")])
    assert failed == "1 failed (RuntimeError: gloo connect failed); `tuner trials --all` lists each"
