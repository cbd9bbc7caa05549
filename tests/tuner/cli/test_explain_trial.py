"""`tuner explain --study S --trial N` on bad input: an unknown study, a trial number the study lacks, a trial that
measured nothing (ruled out without running; failed before its memory window) are each one line, exit 2, before any
trace (the entry point in-process; a stored study written as the search writes it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.helpers.sample_storage import SampleStudy
from trials.contract import Knobs, ProbeConfig, ProbeResult, RankMemory
from tuner.cli import main as tuner_main

MiB = 1 << 20


@pytest.fixture()
def url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/t.db"
    sample = SampleStudy(url, "s", {"model": {"source": "builtin:tiny-t5"}, "world_size": 1, "device_memory": 64 * MiB})
    config = ProbeConfig(knobs=Knobs(micro_batch_size=2, max_length=64, engine="torch"), device_memory=64 * MiB)
    oom = ProbeResult(status="oom", cause="OutOfMemoryError", ranks=[RankMemory(rank=0, oom_need=70 * MiB)])
    sample.probe(config, oom, trial_number=0, config_key="a", fidelity="baseline")
    sample.inferred(config, trial_number=1, config_key="b", cause="estimated peak over the device memory")
    sample.probe(config, ProbeResult(status="error", cause="ValueError: broken"), trial_number=2, config_key="c")
    return url


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--study", "nope", "--trial", "0"], "nope"),
        (["--study", "s", "--trial", "7"], "study 's' has no trial 7 (its trials are 0-2"),
        (["--study", "s", "--trial", "1"], "--trial 1 of study 's' has no measurement to explain (inferred-oom"),
        (["--study", "s", "--trial", "2"], "--trial 2 of study 's' has no measurement to explain (error: ValueError"),
        (["--study", "s", "--trial", "0", "--oom-message", "x"], "a trial's own failure is recorded"),
    ],
)
def test_bad_trial_input_is_one_line_exit_2(
    url: str, argv: list[str], says: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    monkeypatch.setattr(sys, "argv", ["tuner", "explain", "--storage", url, *argv])
    with pytest.raises(SystemExit) as exit_info:
        tuner_main()
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert exit_info.value.code == 2 and "Traceback" not in err
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], err
