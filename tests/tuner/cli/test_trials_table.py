"""`tuner trials` where a person reads it (issue 40 §4): on a real 80-column terminal (a pty) every row keeps its trial,
status, samples/s, peak and config, and a refusal is shown whole; piped, one tab-separated line per row; --wide, every
column on one line per row. The study is real storage written by the search's own writers."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from tests.helpers.report_study import CAPACITY, populate_study
from tests.helpers.sample_storage import SampleStudy
from tests.helpers.terminal import run_in_terminal
from trials.contract import Knobs, ProbeConfig, ProbeResult
from tuner.cli.listing import Cells
from tuner.cli.trials_table import Headings, choose, table, tsv

TUNER = str(Path(sys.executable).with_name("tuner"))
REFUSAL = (
    "FSDP2 cannot shard this model: parameter 'shared.weight' is shared by modules accelerate puts in different FSDP "
    "groups (as T5's shared / embed_tokens); untie those weights, or search engine deepspeed"
)
LONG = {
    "micro_batch_size": 2,
    "max_length": 64,
    "zero_stage": 2,
    "reduce_bucket_size": 50000000,
    "allgather_bucket_size": 20000000,
    "overlap_comm": False,
    "contiguous_gradients": True,
    "offload_optimizer": True,
    "gradient_checkpointing": True,
}


def _study(url: str) -> int:
    """The report study, three FSDP2 probes refused with T5's shared-parameter reason and a config with every ZeRO
    knob set; returns how many rows `tuner trials` lists by default."""
    populate_study(url, "s")
    sample = SampleStudy(url, "s")
    sample.distributions = {
        "micro_batch_size": optuna.distributions.IntDistribution(1, 64, log=True),
        "max_length": optuna.distributions.CategoricalDistribution([64, 128]),
        "zero_stage": optuna.distributions.IntDistribution(0, 3),
    }
    sample.trial({"micro_batch_size": 3, "max_length": 64, "zero_stage": 1}, "error")  # trial 48: the hostile error
    number = 49
    for micro in (1, 2, 4):
        knobs = Knobs(micro_batch_size=micro, max_length=64, engine="fsdp2")
        config = ProbeConfig(knobs=knobs, gradient_accumulation_steps=32 // micro, device_memory=CAPACITY)
        result = ProbeResult(status="refused", cause=REFUSAL, capacity=CAPACITY, wall_s=1.0)
        sample.probe(config, result, trial_number=number, config_key=f"fsdp{micro}")
        sample.trial({"micro_batch_size": micro, "max_length": 64}, "refused", None)
        number += 1
    config = ProbeConfig(knobs=Knobs(**LONG), gradient_accumulation_steps=16, device_memory=CAPACITY)
    ok = ProbeResult.model_validate(
        {
            "status": "ok",
            "samples_per_s": 3.0,
            "tokens_per_s": 192.0,
            "capacity": CAPACITY,
            "wall_s": 9.0,
            "steps": {
                "micro_mean_s": 0.1,
                "micro_p50_s": 0.1,
                "micro_max_s": 0.1,
                "optimizer_step_s": 0.1,
                "cycle_s": 1,
            },
            "ranks": [{"rank": 0, "peak_allocated": 100 << 20, "peak_reserved": 100 << 20, "capacity": CAPACITY}],
        }
    )
    sample.probe(config, ok, trial_number=number, config_key="long")
    sample.trial({"micro_batch_size": 2, "max_length": 64, "zero_stage": 2}, "ok", 192.0)
    return 46 + 1 + 2 + 1 + 3 + 1  # ok, the pick's confirm, oom and error of the report study, refused, the long one


@pytest.fixture()
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'trials.db'}"


def test_at_80_columns_every_row_keeps_trial_status_speed_peak_and_config(url: str) -> None:
    listed = _study(url)
    code, screen = run_in_terminal([TUNER, "trials", "--study", "s", "--storage", url], columns=80)
    assert code == 0, screen
    lines = screen.rstrip("\n").split("\n")
    assert max(len(line) for line in lines) <= 80, max(lines, key=len)
    head = next(i for i, line in enumerate(lines) if line.startswith("trial "))
    assert lines[head].split()[:5] == ["trial", "status", "tokens/s", "peak", "s"] or lines[head].split()[:4] == [
        "trial",
        "status",
        "samples/s",
        "peak",
    ]
    assert lines[head].split()[-1] in ("config", "ranks")
    rows = [line for line in lines[head + 1 :] if line[:1].isdigit() or line.startswith("- confirm ")]
    assert len(rows) == listed
    for line in rows:
        fields = line.replace("- confirm", "-").split()
        assert fields[1] in ("ok", "oom", "refused", "error"), line  # the status
        # the throughput (or "-"), the peak ("432.0 MiB", "-") and the config are on the row itself
        assert "micro=" in line and ("MiB" in line or " - " in line), line
    # the config with every ZeRO knob is whole (wrapped inside its column, not cut)
    long_row = next(i for i, line in enumerate(lines) if line.startswith("52 "))
    config = " ".join(line[lines[head].index("config") :].strip() for line in lines[long_row : long_row + 2])
    assert config.startswith("micro=2 len=64 z2 allgather=2e7 reduce=5e7 offload ckpt")
    # the refusal is the only answer to why those configs never ran: whole, under each row, never "FSD…"
    text = " ".join(" ".join(line.split()) for line in lines)
    assert text.count(REFUSAL.replace("  ", " ")) == 3 and "\u2026" not in text
    assert "pick: trial 5," in screen  # the pick, and which statistic its figure is


def test_piped_output_is_one_tab_separated_line_per_row(url: str) -> None:
    listed = _study(url)
    done = subprocess.run(
        [TUNER, "trials", "--study", "s", "--storage", url], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1 + listed and all(line.strip() for line in lines)  # no blank or folded lines
    heading = lines[0].split("\t")
    assert (
        heading[:4] == ["trial", "status", "tokens/s", "peak"]
        and "config" in heading
        and heading[-1] == "cause / ranks"
    )
    assert all(line.count("\t") == len(heading) - 1 for line in lines)
    cells = [dict(zip(heading, line.split("\t"), strict=True)) for line in lines[1:]]
    refused = [c for c in cells if c["status"] == "refused"]
    assert len(refused) == 3 and all(c["cause / ranks"] == REFUSAL for c in refused)
    assert [c["trial"] for c in cells if c["status"] == "ok pick"] == ["5"]
    assert "study s (retained tokens/s)" in done.stderr and "pick: trial 5," in done.stderr  # context on stderr
    wide = subprocess.run(
        [TUNER, "trials", "--study", "s", "--storage", url, "--wide"], capture_output=True, text=True, timeout=120
    )
    assert wide.returncode == 0, wide.stderr
    table = wide.stdout.splitlines()
    rows = [line for line in table if line[:1].isdigit() or line.startswith("- confirm")]
    assert len(rows) == listed and REFUSAL in wide.stdout


def _cells(n: int, cause: str = "", config: str = "micro=4 len=64 z2") -> Cells:
    return Cells(str(n), "ok", "1,234.5", "432.0 MiB", "5", "", config, cause)


def test_the_layout_keeps_the_required_columns_and_adds_cause_phases_seconds_as_they_fit() -> None:
    config = "micro=4 len=64 z2 allgather=2e7 reduce=5e7 offload ckpt"
    cause = "r0=1 MiB r1=2 MiB: IMBALANCE: rank 1 peaks 100% above rank 0"
    rows = [_cells(1, config=config), _cells(2, cause=cause, config=config)]
    phased = [dataclasses.replace(r, phases="432.0 MiB / 12.0 MiB") for r in rows]
    headings = Headings(phases="train / eval")
    every = ["trial", "status", "value", "peak", "seconds", "phases", "config", "cause"]
    assert choose(phased, headings, None)[0] == every == choose(phased, headings, 200)[0]
    assert choose(phased, headings, 100)[0] == ["trial", "status", "value", "peak", "seconds", "config", "cause"]
    assert choose(phased, headings, 80)[0] == ["trial", "status", "value", "peak", "seconds", "config"]
    assert choose(phased, headings, 60)[0] == ["trial", "status", "value", "peak", "config"]
    for width in (60, 80, 100):
        lines = table(phased, headings, width)
        assert all(len(line) <= width for line in lines), (width, lines)
        text = " ".join(" ".join(line.split()) for line in lines)
        assert text.count("ckpt") == 2 and all(word in text.split() for word in cause.split())  # nothing cut
        assert width == 100 or cause in text  # under its row: whole, in one piece
    assert table(phased, headings, 80)[-1].startswith("  \u21b3 r0=1 MiB") or table(phased, headings, 80)[
        -2
    ].startswith("  \u21b3 r0=1 MiB")
    assert tsv(rows, Headings())[0].split("\t")[-1] == "cause / ranks"
