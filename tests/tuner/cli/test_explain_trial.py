"""`tuner explain --study S --trial N` on bad input: an unknown study, a trial number the study lacks, a trial that
measured nothing (ruled out without running; failed before its memory window) are each one line, exit 2, before any
trace (the entry point in-process; a stored study written as the search writes it); and a trial's CUDA memory
snapshot read by parts (one trace)."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import pytest

from tests.helpers.sample_storage import SampleStudy
from tests.tuner.memory.test_snapshot_parts import block, frame, snapshot
from trials.contract import FailedAllocation, Knobs, ProbeConfig, ProbeResult, RankMemory
from tuner.cli import main as tuner_main

MiB = 1 << 20
GiB = 1 << 30


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


def _snapshot_file(path: Path) -> str:
    """A CUDA memory snapshot in torch's format (tests/tuner/memory/test_snapshot_parts.py builds it), pickled."""
    adam = [frame("/site-packages/torch/optim/adamw.py", "_init_group")]
    forward = [frame("/site-packages/transformers/models/t5/modeling_t5.py", "forward")]
    s = snapshot(
        block(3 * GiB, []),
        block(2 * GiB, adam),
        block(GiB, forward),
        block(GiB // 2, [frame("/w/jobs/custom_loss.py", "smooth", 42)]),
        block(GiB, adam, state="inactive"),
        block(GiB // 4, [], address=99 * GiB),  # the backward's thread: no Python frames, its alloc in the trace
    )
    s["device_traces"][0].insert(0, {"action": "alloc", "addr": 99 * GiB, "size": GiB // 4, "stream": 0, "frames": []})
    path.write_bytes(pickle.dumps(s))
    return str(path)


@pytest.mark.slow
def test_a_trials_snapshot_is_read_by_parts_and_a_missing_one_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Through `tuner explain --study S --trial N` (one trace of the tiny model): rank 0's snapshot read by the
    frames that allocated it, beside the estimate's parts; rank 1's file is gone: one line, the rest printed."""
    url = f"sqlite:///{tmp_path}/t.db"
    sample = SampleStudy(url, "s", {"model": {"source": "builtin:tiny-t5"}, "world_size": 1, "device_memory": 64 * MiB})
    config = ProbeConfig(knobs=Knobs(micro_batch_size=2, max_length=64, engine="torch"), device_memory=64 * MiB)
    failed = FailedAllocation(nbytes=8 * MiB, live=60 * MiB, capacity=64 * MiB, phase="train", stage="backward")
    snap = _snapshot_file(tmp_path / "r0.snapshot.pickle")
    ranks = [
        RankMemory(rank=0, oom_need=68 * MiB, failed_allocation=failed, snapshot=snap),
        RankMemory(rank=1, oom_need=68 * MiB, failed_allocation=failed, snapshot=str(tmp_path / "gone.pickle")),
    ]
    oom = ProbeResult(status="oom", cause="OutOfMemoryError", ranks=ranks)
    sample.probe(config, oom, trial_number=0, config_key="a", fidelity="baseline")
    monkeypatch.setenv("COLUMNS", "400")
    monkeypatch.setattr(sys, "argv", ["tuner", "explain", "--storage", url, "--study", "s", "--trial", "0"])
    tuner_main()
    out = capsys.readouterr().out
    assert f"  memory snapshot: {snap} (drag it onto pytorch.org/memory_viz)" in out
    assert (
        "  snapshot: live memory by the frames that allocated it vs the estimate's train forward + backward, GiB:"
        in out
    )
    rows = {line[4:60].strip(): line[60:].split() for line in out.splitlines() if line.startswith("    ")}
    assert rows["optimizer states"][0] == "2.00" and rows["activations + temporaries"][0] == "1.00"
    assert rows["parameters"][0] == "0.00" and rows["before recording (no stack: setup, the model as built)"] == [
        "3.00",
        "-",
    ]
    assert rows["unattributed (no rule matches its frames)"] == ["0.50", "-"]
    assert rows["gradients"][0] == "0.25"
    assert "    of the gradients, recorded with no Python frames (the backward's thread): 0.25 GiB" in out
    assert "    live 6.75 GiB of 7.75 GiB reserved" in out
    assert "    unattributed: jobs/custom_loss.py:42:smooth, 512.00 MiB in 1 block(s)" in out
    assert "  memory snapshot not read: the file is gone (the latest 20 are kept beside the study's database)" in out
    assert out.count("recorded failure, rank") == 2 and "not covered:" in out


def test_the_study_alone_explains_its_first_trial_that_measured(tmp_path: Path) -> None:
    """`tuner explain --study S` without --trial: trial 0 refused before launching (their release fills what
    DeepSpeed refuses) or ruled out measured nothing; the first trial whose ranks measured memory is explained."""
    from tuner.session.explain_trial import first_explainable
    from tuner.storage.store import Store

    url = f"sqlite:///{tmp_path}/r.db"
    sample = SampleStudy(url, "r", {"model": {"source": "builtin:tiny-t5"}, "world_size": 1, "device_memory": 64 * MiB})
    config = ProbeConfig(knobs=Knobs(micro_batch_size=2, max_length=64, engine="torch"), device_memory=64 * MiB)
    refused = ProbeResult(status="refused", cause="refused before launching: warmup_num_steps must be positive")
    sample.probe(config, refused, trial_number=0, config_key="a", fidelity="baseline")
    sample.inferred(config, trial_number=1, config_key="b", cause="estimated peak over the device memory")
    assert first_explainable(Store(url).probes("r")) is None
    oom = ProbeResult(status="oom", cause="OutOfMemoryError", ranks=[RankMemory(rank=0, oom_need=70 * MiB)])
    sample.probe(config, oom, trial_number=2, config_key="c")
    assert first_explainable(Store(url).probes("r")) == 2
