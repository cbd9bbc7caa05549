"""A search with --dataset (issue 21 §2-3): the job's lengths are the data's longest sample unless a flag or the
training args truncate, each length says where it came from, and the dry run says when the user's config would crash
on their data. The data and tokenizer are tests/helpers/seq2seq_data.py's (built offline); the estimator is the real
one over a trace given as data (tracing a model is the e2e tests' business)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tests.helpers.seq2seq_data import long_tail_lengths, save_tiny_t5, write_jsonl
from trials.contract import Knobs
from tuner.errors import ConfigError
from tuner.memory.estimator import Estimator, Trace, TracePoint
from tuner.session.options import CLI, SearchOptions, prepare_request
from tuner.session.plan import baseline_crash

MiB = 1 << 20


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("data-request")
    model = save_tiny_t5(root / "t5")
    data = write_jsonl(root / "data.jsonl", long_tail_lengths(400))
    return root, model, data


def options(files, **kw) -> SearchOptions:
    _, model, data = files
    values = {
        "budget": "10m",
        "model": str(model),
        "dataset": str(data),
        "input_column": "source",
        "target_column": "target",
        "space": {"micro_batch_size": [2], "zero_stage": [0]},
        **kw,
    }
    return SearchOptions.of(values)


def request(files, **kw):
    root = files[0]
    return prepare_request(options(files, **kw), f"sqlite:///{root}/t.db", CLI, cache_dir=root / "cache")[0]


def test_the_job_holds_the_datas_longest_sample_and_says_so(files):
    r = request(files)
    assert r.job is not None and r.data is not None
    assert r.job.max_length == int(r.data.lengths.input.max()) > 300  # the long tail, untruncated
    assert r.job.max_target_length == int(r.data.lengths.target.max())
    lines = r.data_lines()
    assert lines[0].startswith("data: 400 samples of")
    assert lines[1].startswith("  inputs: p50 ") and lines[2].startswith("  targets: p50 ")
    assert lines[3] == (
        f"lengths: inputs {r.job.max_length} (data's longest sample), labels {r.job.max_target_length} "
        "(data's longest sample)"
    )
    assert lines[4] == "truncation: truncates nothing; padding: longest (as your collator pads)"


def test_a_flag_truncates_and_the_job_line_says_how_much(files):
    r = request(files, max_length=64)
    assert r.job is not None and r.job.max_length == 64
    lengths = r.data_lines()[3]
    assert lengths.startswith("lengths: inputs 64 (flag), labels ")
    cut = r.data_lines()[4]
    assert r.data is not None
    share = float(np.mean(r.data.lengths.input > 64))  # the long tail (about 1 sample in 50)
    assert 0 < share < 0.05 and cut.startswith(f"truncation: truncates {share * 100:.1f}% of samples, ")
    assert "(inputs at 64)" in cut


def test_training_args_lengths_are_named(files, tmp_path):
    args = tmp_path / "args.json"
    args.write_text('{"per_device_train_batch_size": 2, "max_source_length": 100, "bf16": false}')
    r = request(files, baseline=str(args))
    assert r.job is not None and r.job.max_length == 100
    assert "inputs 100 (args: max_source_length)" in r.data_lines()[3]


def test_dataset_and_lengths_together_and_bad_padding_are_one_line(files, tmp_path):
    lengths = tmp_path / "l.txt"
    lengths.write_text("1\n2\n")
    with pytest.raises(ConfigError, match="give --dataset or --lengths, not both"):
        request(files, lengths=str(lengths))
    with pytest.raises(ConfigError, match="--padding 'left': choose one of longest, max_length"):
        request(files, padding="left")
    with pytest.raises(ConfigError, match="built-in preset with no tokenizer; give --tokenizer"):
        request(files, model="builtin:tiny-t5")


def _trace(lengths: list[int]) -> Trace:
    """A trace whose activations grow as attention does: per sample 1 KiB x L + 16 B x L^2."""
    points = [
        TracePoint(micro_batch_size=2, max_length=n, activation_bytes=2 * (1024 * n + 16 * n * n)) for n in lengths
    ]
    return Trace(param_count=1000, param_bytes=4000, largest_param=100, points=points)


def test_the_dry_run_says_when_their_config_crashes_on_their_data(files):
    r = request(files, device_memory="4MiB")
    assert r.data is not None and r.job is not None
    r.baseline = Knobs(micro_batch_size=2, max_length=r.job.max_length, zero_stage=0)
    estimator = Estimator(_trace([40, r.job.max_length]), world_size=4, global_batch=8)
    line = baseline_crash(r, estimator)
    assert line is not None and line.startswith("your config on your data: 1 batch in ")
    # the worst batch (two samples padded to the longest input) needs more than 4 MiB, a median one far less
    longest = r.job.max_length
    assert (
        estimator.predict(r.baseline).calibrated
        > 4 * MiB
        > estimator.predict(
            r.baseline.model_copy(update={"max_length": int(np.median(r.data.lengths.input))})
        ).calibrated
    )
    assert f"needs more than 4.0 MiB (the worst, 2 x {longest} tokens" in line
    assert "with shuffling your run crashes after about" in line and "(median; 90% within" in line
    assert f"the estimate traced inputs of 40, {longest} tokens" in line
    roomy = request(files, device_memory="1GiB")
    roomy.baseline = r.baseline
    assert "every batch fits in 1.00 GiB" in (baseline_crash(roomy, estimator) or "")
    assert baseline_crash(request(files), estimator) is None  # no device memory: nothing to compare with


def test_with_data_the_trace_adds_the_median_length_and_caps_the_longest(files):
    from tuner.memory.tracing import shape_points
    from tuner.session.memory import shapes

    r = request(files)
    assert r.data is not None and r.job is not None
    median = int(sorted(r.data.lengths.input.tolist())[(len(r.data.lengths) + 1) // 2 - 1])
    ckpt = (False, True)  # the default space's gradient checkpointing choices
    traced = shapes(r)
    assert traced.extra_lengths == (median,) and traced.length_cap == 2048
    assert shape_points(traced) == sorted((2, n, c, "fp32", False) for n in (median, r.job.max_length) for c in ckpt)
    capped = dataclasses.replace(traced, length_cap=100)  # the data's longest input is past it: traced at 100
    assert shape_points(capped) == sorted((2, n, c, "fp32", False) for n in (median, 100) for c in ckpt)
    r.data = None
    assert shapes(r).extra_lengths == () and shape_points(shapes(r)) == sorted(
        (2, r.job.max_length, c, "fp32", False) for c in ckpt
    )


def test_a_causal_lm_preset_reads_its_text_column_with_the_given_tokenizer(files, tmp_path):
    root, model, _ = files
    texts = tmp_path / "texts.csv"
    texts.write_text("text\n" + "".join(("w1 " * n).strip() + "\n" for n in (3, 5, 40)))
    values = {
        "budget": "10m",
        "model": "builtin:tiny-llama",
        "dataset": str(texts),
        "text_column": "text",
        "tokenizer": str(model),  # a preset has no tokenizer of its own
        "space": {"micro_batch_size": [1], "zero_stage": [0]},
    }
    r = prepare_request(SearchOptions.of(values), f"sqlite:///{root}/c.db", CLI, cache_dir=root / "cache")[0]
    assert r.job is not None and r.job.max_length == 41 and r.job.max_target_length is None  # 40 words + </s>
    lines = r.data_lines()
    assert lines[1] == "  inputs: p50 6, p90 41, p99 41, p99.9 41, max 41 tokens (3 samples)"
    assert lines[2] == "lengths: inputs 41 (data's longest sample)" and not any("targets" in line for line in lines)


def test_a_search_with_data_probes_memory_at_its_worst_batch_and_times_batches_drawn_from_it(files):
    from tuner.records import Fidelity
    from tuner.search.setup import SearchSetup

    r = request(files, seed=3)
    assert r.data is not None and r.job is not None
    assert r.objective.unit == "samples/s on drawn batches"
    setup = SearchSetup.of(r)
    knobs = Knobs(micro_batch_size=2, max_length=r.job.max_length, engine="torch")
    short = setup.probe_config(knobs, Fidelity.SHORT, 60.0)
    assert short.batches is not None and short.seed == 3
    assert short.batches.worst.input_length == int(r.data.lengths.input.max())  # the tail's sample, every rank
    drawn = short.batches.timed[0]
    inputs = set(r.data.lengths.input.tolist())
    assert len(drawn) == r.schedule.short[1] and all(b.input_length in inputs for b in drawn)
    assert setup.probe_config(knobs, Fidelity.SHORT, 60.0).batches == short.batches  # the same seed, the same shapes
    confirm = setup.probe_config(knobs, Fidelity.CONFIRM, 60.0).batches
    assert confirm is not None and len(confirm.timed[0]) == r.schedule.confirm[1]
    plain = dataclasses.replace(setup, data=None).probe_config(knobs, Fidelity.SHORT, 60.0)
    assert plain.batches is None  # without data: every step at the fixed shape, as before


def test_a_study_resumed_without_its_dataset_probes_on_the_stored_summary(files):
    """A worker without --dataset (or a study POSTed with sample_lengths) probes memory at the stored summary's worst
    batch (the data's or longer by its rounding) and times batches drawn from it; a --dataset given wins."""
    from tuner.job.length_summary import LengthSummary
    from tuner.records import Fidelity, RecordError
    from tuner.search.request import request_from_definition
    from tuner.search.setup import SearchSetup
    from tuner.session.session import resolve
    from tuner.storage import Store

    r = request(files, seed=3)
    assert r.data is not None and r.job is not None
    store = Store(r.storage)
    resolve(r, set(), store)  # creates the study, its definition holding the data's summary
    bare = dataclasses.replace(r, data=None, length_sources={})  # the same study, this run read no dataset
    resumed, was_resumed = resolve(bare, set(), store)
    assert was_resumed and resumed.data is not None and resumed.data.rounded is False  # 400 samples: stored exactly
    summary = LengthSummary.from_json(r.definition()["data"])
    assert resumed.data.described.startswith(summary.origin.describe(400) + "; from the study's stored summary")
    assert resumed.data_lines()[0] == f"data: {resumed.data.described}"
    assert "lengths: inputs" in resumed.data_lines()[3] and "(the study's job)" in resumed.data_lines()[3]
    knobs = Knobs(micro_batch_size=2, max_length=r.job.max_length, engine="torch")
    stored = SearchSetup.of(resumed).probe_config(knobs, Fidelity.SHORT, 60.0).batches
    read = SearchSetup.of(r).probe_config(knobs, Fidelity.SHORT, 60.0).batches
    assert stored is not None and read is not None
    assert stored.worst == read.worst and stored.worst.input_length == int(r.data.lengths.input.max())
    assert len(stored.timed[0]) == r.schedule.short[1]
    assert {b.input_length for b in stored.timed[0]} <= set(r.data.lengths.input.tolist())
    again, _ = resolve(r, {"data"}, store)  # a --dataset given on resume: compared with the summary, then it wins
    assert again.data is r.data
    broken = {**r.definition(), "data": {"version": 9}}
    with pytest.raises(RecordError, match="version 9; this tuner reads 1; give --dataset to probe on your data"):
        request_from_definition(bare, broken)


def test_a_rounded_summary_makes_the_resumed_worst_batch_conservative(files):
    """With more distinct lengths than the summary's cells, the stored worst batch is as long or longer."""
    from tuner.job.length_summary import DataOrigin, LengthSummary
    from tuner.records import Fidelity
    from tuner.search.request import request_from_definition
    from tuner.search.setup import SearchSetup

    r = request(files, seed=3)
    assert r.data is not None and r.job is not None
    summary = LengthSummary.of(r.data.lengths, DataOrigin("d"), max_cells=16)
    assert not summary.rounding.exact
    definition = {**r.definition(), "data": summary.to_json()}
    resumed = request_from_definition(dataclasses.replace(r, data=None), definition)
    assert resumed.data is not None and "conservative" in resumed.data_lines()[0]
    knobs = Knobs(micro_batch_size=2, max_length=r.job.max_length, engine="torch")
    worst = SearchSetup.of(resumed).probe_config(knobs, Fidelity.SHORT, 60.0).batches
    assert worst is not None
    exact = int(r.data.lengths.input.max())
    assert exact <= worst.worst.input_length <= min(exact + summary.rounding.input_tokens, r.job.max_length)
