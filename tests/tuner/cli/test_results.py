"""`tuner trials` (tuner.cli.results): per-rank peaks and the imbalance flag, through the real entry point."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from report_study import populate_study

from tuner.storage.store import Store


@pytest.fixture()
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'tuner.db'}"


def test_tuner_trials_shows_per_rank_peaks_and_the_imbalance_flag(url: str) -> None:
    from tuner.cli.results import trial_rows

    populate_study(url, "ranks")
    notes = [r["ranks"] for r in trial_rows(Store(url), "ranks") if r["ranks"]]
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
    from tuner.search.rows import ProbeRow

    populate_study(url, "causes")
    cause = "RuntimeError: NCCL failed [stderr: rank 1 exited] [/] [bold]x[/bold]"
    Store(url).record_probe(
        ProbeRow.from_record(
            {
                "study_name": "causes",
                "trial_number": None,
                "fidelity": "confirm",
                "config_key": "markup",
                "knobs": {"micro_batch_size": 5, "max_length": 64, "zero_stage": 1},
                "config": {},
                "status": "error",
                "cause": cause,
                "stable": False,
            }
        )
    )
    monkeypatch.setenv("COLUMNS", "400")
    monkeypatch.setattr(sys, "argv", ["tuner", "trials", "--study", "causes", "--storage", url])
    tuner_main()  # returns on success (exits only on an error)
    out = capsys.readouterr()
    assert "Traceback" not in out.err, out.err
    assert cause in out.out, out.out[-3000:]
