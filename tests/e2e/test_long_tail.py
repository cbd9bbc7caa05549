"""Issue 21 §4: dynamic padding over data with a long tail crashes where a probe at the typical length does not.

A tiny T5 and its tokenizer (saved together, built offline), a JSON-lines set whose inputs are mostly 5-40 words and
1 in 50 are 300-400; the lengths read by the real `datasets` + tokenizer path. Real probes on the emulated CPU device
(exact live-tensor accounting): at the worst batch the data makes (two samples padded to the longest input and the
longest target, as DataCollatorForSeq2Seq pads the batch that holds them) the probe runs out of a device memory in
which the fixed-shape probe at the median length fits; the crash arithmetic then says how soon a shuffled run meets
such a batch."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.seq2seq_data import long_tail_lengths, save_tiny_t5, write_jsonl
from trials.contract import JobSettings, Knobs, ModelSpec
from tuner.job.dataset import DataSource, read_lengths
from tuner.job.lengths import Quantiles
from tuner.job.padding import BatchShape, Collation, worst_batch
from tuner.memory.crash import crash_odds
from tuner.probing.config import probe_config
from tuner.probing.runner import run_probe

pytestmark = pytest.mark.slow
MICRO = 2


def _probe(model: Path, shape: BatchShape, work: Path, device_memory: int | None = None):
    knobs = Knobs(micro_batch_size=shape.batch, max_length=shape.input_length, engine="torch")
    job = JobSettings(max_target_length=shape.target_length)
    cfg = probe_config(
        model=ModelSpec(source=str(model)), knobs=knobs, job=job, device_memory=device_memory, timeout_s=240
    )
    return run_probe(cfg, work)


def test_the_worst_batch_ooms_where_the_median_probe_fits(tmp_path: Path) -> None:
    model = save_tiny_t5(tmp_path / "t5")
    data = write_jsonl(tmp_path / "data.jsonl", long_tail_lengths(400))
    read = read_lengths(
        DataSource(str(data), input_column="source", target_column="target"), str(model), tmp_path / "cache"
    )
    lengths = read.lengths
    assert lengths.target is not None
    median = BatchShape(MICRO, Quantiles.of(lengths.input).p50, Quantiles.of(lengths.target).p50)
    worst = worst_batch(lengths, MICRO, Collation())
    assert worst.input_length > 300 > 10 * median.input_length  # the tail

    unlimited = _probe(model, worst, tmp_path / "worst-free")
    assert unlimited.status == "ok", unlimited.cause
    assert unlimited.peak_allocated is not None
    device = int(unlimited.peak_allocated * 0.75)  # the worst batch's own peak does not fit in it

    typical = _probe(model, median, tmp_path / "median", device)
    assert typical.status == "ok", typical.cause  # a fixed-shape probe at the median length says "fits"
    assert typical.peak_allocated is not None and typical.peak_allocated < device

    crashed = _probe(model, worst, tmp_path / "worst", device)
    assert crashed.status == "oom", crashed.cause  # the batch their collator makes from the tail does not
    assert crashed.oom_need is not None and crashed.oom_need > device

    # when a shuffled run meets such a batch: the measured peaks as the need (the median's for every batch whose
    # padded input is at most the median's, the worst's above it: a coarse step, exact at the two probed shapes)
    def need(shape: BatchShape) -> float:
        return float(typical.peak_allocated if shape.input_length <= 4 * median.input_length else crashed.oom_need)

    odds = crash_odds(lengths, MICRO, 1, Collation(), need, device)
    assert not odds.fits_worst and 0 < odds.unfit_share < 0.1
    tail = float((lengths.input > 4 * median.input_length).mean())
    assert odds.unfit_share == pytest.approx(1 - (1 - tail) ** MICRO)
    assert "needs more than" in odds.describe() and "with shuffling your run crashes after about" in odds.describe()
