"""tuner.job.length_summary: the user's lengths as a study stores them: exact when few, bounded and rounded UP when
many (so the crash calculation over- and never under-states the share of batches that do not fit)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.helpers.seq2seq_data import seed_shaped
from tuner.job.data_job import stored_data_job
from tuner.job.length_summary import MAX_CELLS, DataOrigin, LengthSummary, SummaryError, round_up
from tuner.job.lengths import SampleLengths
from tuner.job.padding import BatchShape, Collation, draw_batches, worst_batch
from tuner.memory.crash import crash_odds

ORIGIN = DataOrigin("data.jsonl", "train", "source", "target", None, "tok", 100_000, None)


def need(shape: BatchShape) -> float:
    """Attention-like: a*L + b*L^2 per sample of the padded input, plus the labels."""
    length = shape.input_length
    return 1e9 + shape.batch * (1e5 * length + 200.0 * length * length + 3e4 * (shape.target_length or 0))


def test_few_distinct_lengths_are_stored_exactly_and_round_trip() -> None:
    lengths = SampleLengths.of([5, 5, 9, 300], [2, 3, 3, 7])
    s = LengthSummary.of(lengths, ORIGIN)
    assert s.rounding.exact and "lengths stored exactly" in s.describe()
    assert s.expand() == lengths.__class__.of([5, 5, 9, 300], [2, 3, 3, 7])  # same multiset, sorted the same way
    back = LengthSummary.from_json(json.loads(json.dumps(s.to_json())))
    assert back.rows == s.rows and back.origin == ORIGIN and back.padding == "longest" and back.samples == 4
    causal = LengthSummary.of(SampleLengths.of([7, 7, 3]), ORIGIN, "max_length")
    assert causal.rows == ((3, 1), (7, 2)) and not causal.seq2seq
    assert LengthSummary.from_json(causal.to_json()).padding == "max_length"


def test_rounding_is_up_to_the_significant_bits() -> None:
    values = np.array([0, 1, 63, 64, 65, 100, 8990, 9000], dtype=np.int64)
    rounded = round_up(values, 6)
    assert rounded.tolist() == [0, 1, 63, 64, 66, 100, 9216, 9216]
    assert np.all(rounded >= values) and np.all(rounded - values < values * 2.0 ** (1 - 6) + 1)


def test_a_100k_seed_shaped_set_stays_a_few_kib_and_only_rounds_up() -> None:
    lengths = seed_shaped(100_000)
    s = LengthSummary.of(lengths, ORIGIN)
    text = json.dumps(s.to_json(), separators=(",", ":"))
    assert len(text) < 6 * 1024 and len(s.cells()[1]) <= MAX_CELLS
    assert s.samples == 100_000 and not s.rounding.exact
    assert "rounded up (conservative" in s.describe() and f"at most {s.rounding.input_tokens:,} tokens" in s.describe()
    # every sample's stored (input, target) is at least its own: sorted, the stored inputs dominate the true ones,
    # and the stored longest input is the true longest rounded up by less than 2^-5 of it
    expanded = s.expand()
    assert np.all(np.sort(expanded.input) >= np.sort(lengths.input))
    assert np.all(np.sort(expanded.target) >= np.sort(lengths.target))  # type: ignore[arg-type]
    assert lengths.input.max() <= s.longest_input < lengths.input.max() * (1 + 2**-5)
    assert 0 < s.rounding.input_tokens < 300 and 0 < s.rounding.target_tokens < 30
    assert LengthSummary.from_json(json.loads(text)).rows == s.rows


@pytest.mark.parametrize(("micro", "limit"), [(2, 31e9), (4, 31e9), (8, 60e9), (16, 40e9)])
def test_the_crash_odds_of_the_summary_are_conservative_and_close(micro: int, limit: float) -> None:
    lengths = seed_shaped(20_000, seed=3)
    s = LengthSummary.of(lengths, ORIGIN)
    full = crash_odds(lengths, micro, 4, Collation(), need, int(limit))
    cells, counts = s.cells()
    summ = crash_odds(cells, micro, 4, Collation(), need, int(limit), counts)
    assert summ.unfit_share >= full.unfit_share - 1e-12  # conservative (up to float summation order)
    assert summ.unfit_share <= full.unfit_share * 1.5 + 1e-3  # and close
    assert summ.worst_need >= full.worst_need
    if full.median_samples is not None:
        assert summ.median_samples is not None and summ.median_samples <= full.median_samples
    # the cells with counts are the same calculation as the summary expanded to one row per sample
    same = crash_odds(s.expand(), micro, 4, Collation(), need, int(limit))
    assert same.unfit_share == pytest.approx(summ.unfit_share, abs=1e-12)


def test_an_exact_summary_gives_the_exact_crash_odds() -> None:
    lengths = SampleLengths.of([10, 20, 20, 400, 30] * 20, [3, 5, 5, 9, 4] * 20)
    s = LengthSummary.of(lengths, ORIGIN)
    assert s.rounding.exact
    cells, counts = s.cells()
    small = lambda b: 1e3 * b.batch * b.input_length  # noqa: E731
    assert crash_odds(cells, 2, 1, Collation(), small, 100_000, counts) == crash_odds(
        lengths, 2, 1, Collation(), small, 100_000
    )


@pytest.mark.parametrize(
    ("stored", "match"),
    [
        ({"version": 9}, "version 9"),
        ({"version": 1, "seq2seq": True, "rows": []}, "has no rows"),
        ({"version": 1, "seq2seq": True, "rows": [[5, 3]], "origin": {"source": "x"}}, r"row \[5, 3\]"),
        ({"version": 1, "seq2seq": False, "rows": [[5, 0]], "origin": {"source": "x"}}, r"row \[5, 0\]"),
        ({"version": 1, "seq2seq": False, "rows": [[5, 1]], "padding": "left"}, "padding 'left'"),
        ({"version": 1, "seq2seq": False, "rows": [[5, 1]], "origin": {}}, "no source"),
    ],
)
def test_a_stored_summary_that_is_not_one_is_one_line(stored: dict, match: str) -> None:
    with pytest.raises(SummaryError, match=match):
        LengthSummary.from_json(stored)


def test_where_the_lengths_came_from_is_said() -> None:
    sampled = DataOrigin("d", "train", total=100_000, max_samples=5_000, tokenizer="t5")
    assert (
        sampled.describe(5_000)
        == "a seeded random 5,000 of 100,000 samples (--max-samples) of d [train], tokenized with t5"
    )
    assert DataOrigin.from_json(sampled.to_json()) == sampled


@pytest.mark.parametrize(("micro", "limits"), [(1, (None, None)), (4, (None, None)), (8, (512, 32)), (2, (9000, None))])
def test_the_summary_gives_the_worst_batch_of_the_full_lengths_up_to_its_rounding(
    micro: int, limits: tuple[int | None, int | None]
) -> None:
    """What a search without --dataset probes memory at: the stored summary's worst batch is the data's, or longer by
    at most the rounding the summary states (never shorter: conservative)."""
    lengths = seed_shaped(50_000, seed=5)
    s = LengthSummary.of(lengths, ORIGIN)
    assert not s.rounding.exact
    collation = Collation("longest", *limits)
    full = worst_batch(lengths, micro, collation)
    data = stored_data_job(s)
    stored = worst_batch(data.lengths, micro, data.collation(*limits))
    assert stored.batch == full.batch == micro
    assert full.input_length <= stored.input_length <= full.input_length + s.rounding.input_tokens
    assert full.target_length is not None and stored.target_length is not None
    assert full.target_length <= stored.target_length <= full.target_length + s.rounding.target_tokens
    drawn = draw_batches(data.lengths, micro, data.collation(*limits), 20, seed=1)
    cells = set(s.cells()[0].input.tolist())
    assert all(b.input_length in cells or b.input_length == limits[0] for b in drawn)  # the stored lengths' shapes


def test_the_summary_as_a_searchs_data_says_it_is_stored_and_rounded_up() -> None:
    origin = DataOrigin("data.jsonl", "train", "source", "target", None, "tok", 20_000, None)
    s = LengthSummary.of(seed_shaped(20_000), origin)
    data = stored_data_job(s)
    assert data.origin == origin and data.padding == s.padding and len(data.lengths) == s.samples
    head = "20,000 samples of data.jsonl [train], tokenized with tok; from the study's stored summary (no --dataset): "
    assert data.described.startswith(head + "lengths rounded up (")
    assert f"inputs by at most {s.rounding.input_tokens:,} tokens" in data.described
    assert "the probes' worst batch is the data's or longer (conservative)" in data.described
    lines = data.lines(s.longest_input, 61, {"max_length": "the study's job"})
    assert lines[-1].startswith("truncation: truncates nothing (at most: the stored lengths are rounded up); ")
    # a job length at the data's longest (9,000 here) may cut a rounded-up stored length: an upper bound, said so
    assert data.lines(9000, 61, {})[-1].endswith(
        "(inputs at 9000) (at most: the stored lengths are rounded up); padding: longest (as your collator pads)"
    )
    exact = stored_data_job(LengthSummary.of(SampleLengths.of([5, 9], [2, 3]), ORIGIN))
    assert exact.described.endswith("(no --dataset): lengths stored exactly") and not exact.rounded
