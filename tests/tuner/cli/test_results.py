"""`tuner trials` (tuner.cli.results): per-rank peaks and the imbalance flag, through the real entry point."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.report_study import populate_study
from tests.helpers.sample_storage import SampleStudy
from trials.contract import Status
from tuner.storage.store import Store


@pytest.fixture()
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'tuner.db'}"


def test_tuner_trials_shows_per_rank_peaks_and_the_imbalance_flag(url: str) -> None:
    from tuner.cli.results import trial_rows

    populate_study(url, "ranks")
    notes = [r.ranks for r in trial_rows(Store(url), "ranks") if r.ranks]
    assert len(notes) == 1
    assert notes[0].startswith("r0=") and " r1=" in notes[0]
    assert "IMBALANCE: rank 0 peaks 67% above rank 1" in notes[0] and "rank-0 gathering" in notes[0]
    tuner = Path(sys.executable).with_name("tuner")
    done = subprocess.run(
        [str(tuner), "trials", "--study", "ranks", "--storage", url],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "400"},
    )
    assert done.returncode == 0, done.stderr
    assert "IMBALANCE" in done.stdout and "r0=" in done.stdout


def test_tuner_trials_prints_stored_causes_verbatim(url: str, monkeypatch, capsys) -> None:
    """Issue 13: a cause is stored text ("[stderr: ...]" from the runner, anything from a probe's message); rich
    read it as markup and dropped the bracketed part, or raised on "[/]"."""
    from tuner.cli import main as tuner_main

    populate_study(url, "causes")
    cause = "RuntimeError: NCCL failed [stderr: rank 1 exited] [/] [bold]x[/bold]"
    knobs = {"micro_batch_size": 5, "max_length": 64, "zero_stage": 1}
    SampleStudy(url, "causes").record(
        trial_number=None, fidelity="confirm", config_key="markup", knobs=knobs, config={}, status="error", cause=cause
    )
    monkeypatch.setenv("COLUMNS", "400")
    monkeypatch.setattr(sys, "argv", ["tuner", "trials", "--study", "causes", "--storage", url])
    tuner_main()  # returns on success (exits only on an error)
    out = capsys.readouterr()
    assert "Traceback" not in out.err, out.err
    assert cause in out.out, out.out[-3000:]


def _trial(n, status, objective=None, stable=False, fidelity="short", reused=None):
    from tuner.cli.listing import Listed

    return Listed(
        trial=n,
        state="COMPLETE" if status == "ok" else "PRUNED",
        fidelity=fidelity,
        status=Status(status),
        cause="",
        objective=objective,
        peak=1 << 20,
        stable=stable,
        knobs={"micro_batch_size": n, "max_length": 64},
        reused_from=reused,
        seconds=3.0,
        ranks="",
    )


def test_trials_lists_probes_best_first_and_all_on_request() -> None:
    from tuner.cli.listing import select_rows

    rows = [
        _trial(0, "ok", 5.0, True, fidelity="baseline"),
        _trial(1, "oom"),
        _trial(2, "inferred-oom", fidelity="inferred"),
        _trial(3, "ok", 9.0, True),
        _trial(4, "ok", 12.0, False),  # fast but above the headroom
        _trial(5, "ok", 9.0, True, reused=3),
        _trial(6, "error"),
    ]
    assert [r.trial for r in select_rows(rows)] == [3, 0, 4, 1, 6]
    assert [r.trial for r in select_rows(rows, everything=True)] == [0, 1, 2, 3, 4, 5, 6]
    assert [r.trial for r in select_rows(rows, status="ok", top=2)] == [3, 0]
    assert [r.trial for r in select_rows(rows, everything=True, status="inferred-oom")] == [2]


def test_trials_as_json_and_csv_and_piped(url: str) -> None:
    import csv
    import io
    import json

    populate_study(url, "fmt")
    tuner = Path(sys.executable).with_name("tuner")

    def run(*extra: str, columns: str = "100") -> str:
        done = subprocess.run(
            [str(tuner), "trials", "--study", "fmt", "--storage", url, *extra],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "COLUMNS": columns},
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    lines = [json.loads(line) for line in run("--json", "--top", "3").splitlines()]
    assert len(lines) == 3 and lines[0]["stable"] and lines[0]["objective"] >= lines[1]["objective"]
    table = list(csv.DictReader(io.StringIO(run("--csv", "--all"))))
    assert len(table) > len(lines) and {"trial", "status", "config", "cause"} <= set(table[0])
    text = run()  # piped: one tab-separated line per row (tests/tuner/cli/test_trials_table.py: on a terminal)
    assert all("\t" in line for line in text.splitlines())
    assert "inferred-oom" not in text  # ruled-out configs only with --all


def test_a_rows_config_leaves_out_the_job_and_reads_short() -> None:
    from tuner.cli.progress import compact

    knobs = {
        "micro_batch_size": 4,
        "max_length": 32,
        "zero_stage": 2,
        "reduce_bucket_size": 200000000,
        "overlap_comm": True,
        "offload_optimizer": True,
        "precision": "bf16",
        "eval_batch_size": 50,
        "generate": True,
        "allgather_bucket_size": None,
    }
    job = {"precision": "bf16", "max_length": 32, "eval_batch_size": 50, "generate": True}
    assert compact(knobs, job) == "micro=4 z2 reduce=2e8 overlap offload"
    assert compact(knobs) == "micro=4 len=32 z2 reduce=2e8 overlap offload precision=bf16 eval=50 generate"


def test_trials_json_and_csv_list_the_production_runs_the_table_prints(url: str) -> None:
    """Issue 20: the table printed the production runs TunerCallback recorded, --json and --csv left them out (a
    script reading them never saw the real run)."""
    import csv
    import io
    import json

    populate_study(url, "prod")
    knobs = {"micro_batch_size": 2, "max_length": 64, "zero_stage": 1}
    recorded = {"rank": 1, "device": "cuda:1", "steps": 40, "step_s": 0.5, "phase": "eval", "memory": "cuda"}
    SampleStudy(url, "prod").record(
        trial_number=None,
        fidelity="production",
        config_key="real-run",
        knobs=knobs,
        config={"world_size": 2},
        status="oom",
        cause="torch.OutOfMemoryError: CUDA out of memory",
        peak_allocated=150 << 20,
        result=recorded,
    )
    tuner = Path(sys.executable).with_name("tuner")

    def run(*extra: str) -> str:
        done = subprocess.run(
            [str(tuner), "trials", "--study", "prod", "--storage", url, *extra],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "COLUMNS": "200"},
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "production run, rank 1 on cuda:1: oom" in run("--all")
    lines = [json.loads(line) for line in run("--all", "--json").splitlines()]
    prod = [line for line in lines if line["state"] == "PRODUCTION"]
    assert len(prod) == 1 and lines[-1] is prod[0]
    assert (prod[0]["fidelity"], prod[0]["status"], prod[0]["peak"], prod[0]["knobs"]) == (
        "production",
        "oom",
        150 << 20,
        knobs,
    )
    assert {k: prod[0]["production"][k] for k in recorded} == recorded
    assert [json.loads(line)["state"] for line in run("--json", "--status", "oom").splitlines()][-1] == "PRODUCTION"
    assert all(json.loads(line)["state"] != "PRODUCTION" for line in run("--json", "--status", "ok").splitlines())
    table = list(csv.DictReader(io.StringIO(run("--csv"))))
    assert (table[-1]["state"], table[-1]["fidelity"], table[-1]["status"]) == ("PRODUCTION", "production", "oom")
    assert table[-1]["config"].startswith("micro=2 len=64")


def test_trials_shows_train_and_eval_peaks_where_stored(url: str, monkeypatch, capsys) -> None:
    """Issue 22 §2: the per-phase peaks a probe stored (RankMemory.phases) as one compact column of the table and in
    --json; a study whose rows have none keeps the table as it was (no column, never a made-up value)."""
    import json

    from tuner.cli import main as tuner_main

    populate_study(url, "phases")
    MiB = 1 << 20
    result = {
        "status": "ok",
        "ranks": [{"rank": 0, "peak_allocated": 9 * MiB, "phases": {"train": 9 * MiB, "eval_forward": 4 * MiB}}],
    }
    knobs = {"micro_batch_size": 7, "max_length": 64, "zero_stage": 1}
    SampleStudy(url, "phases").record(
        trial_number=None,
        fidelity="confirm",
        config_key="phased",
        knobs=knobs,
        config={},
        status="ok",
        peak_allocated=9 * MiB,
        stable=True,
        objective=1.0,
        result=result,
    )
    monkeypatch.setenv("COLUMNS", "400")
    monkeypatch.setattr(sys, "argv", ["tuner", "trials", "--study", "phases", "--storage", url])
    tuner_main()
    out = capsys.readouterr().out
    assert "train / eval" in out and "9.0 MiB / 4.0 MiB" in out, out[-3000:]
    assert "- / -" in out  # the rows stored without phases say so
    monkeypatch.setattr(sys, "argv", ["tuner", "trials", "--study", "phases", "--storage", url, "--json"])
    tuner_main()
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {"train": 9 * MiB, "eval_forward": 4 * MiB} in [r["phase_peaks"] for r in lines]
    populate_study(url, "plain", confirm=False)
    monkeypatch.setattr(sys, "argv", ["tuner", "trials", "--study", "plain", "--storage", url])
    tuner_main()
    assert "train / eval" not in capsys.readouterr().out
