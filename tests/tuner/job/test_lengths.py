import numpy as np
import pytest

from tuner.errors import ConfigError
from tuner.job.lengths import (
    Quantiles,
    SampleLengths,
    Truncation,
    cut,
    cut_points,
    histogram,
    read_lengths_file,
    write_tsv,
)
from tuner.job.objective import load_lengths


def test_quantiles_are_nearest_rank_lengths_of_real_samples():
    q = Quantiles.of(np.arange(1, 1001))
    assert (q.count, q.p50, q.p90, q.p99, q.p999, q.max) == (1000, 500, 900, 990, 999, 1000)
    assert q.mean == 500.5
    one = Quantiles.of(np.array([7]))
    assert (one.p50, one.p999, one.max) == (7, 7, 7)
    with pytest.raises(ConfigError, match="empty"):
        Quantiles.of(np.array([], dtype=np.int64))


def test_cut_counts_samples_longer_and_tokens_past_the_cut():
    c = cut(np.array([10, 20, 30, 40]), 25)
    assert c.samples == 0.5
    assert c.tokens == pytest.approx((5 + 15) / 100)
    assert cut(np.array([10, 20]), 20).samples == 0.0


def test_cut_points_are_powers_of_two_from_the_median_below_the_longest():
    lengths = np.array([100] * 90 + [3000] * 9 + [9000])
    assert cut_points(lengths) == [512, 1024, 2048, 4096, 8192]  # 128 and 256 dropped: five at most
    assert cut_points(lengths, most=2) == [4096, 8192]
    assert cut_points(np.array([5, 5])) == []


def test_truncation_says_what_it_cuts_per_side():
    lengths = SampleLengths.of([10, 20, 1000, 30], [5, 5, 5, 50])
    assert Truncation.of(lengths, None).describe() == "truncates nothing"
    assert not Truncation.of(lengths, 2000, 100).cuts_anything
    t = Truncation.of(lengths, 500, 10)
    assert t.cuts_anything
    assert t.describe() == (
        "truncates 25.0% of samples, 47.2% of tokens (inputs at 500); "
        "truncates 25.0% of samples, 61.5% of tokens (targets at 10)"
    )


def test_histogram_has_one_line_per_non_empty_power_of_two_bin():
    lines = histogram(np.array([0, 3, 3, 3, 100, 5000]))
    labels = [line.split()[0] for line in lines]
    assert labels == ["0", "3-4", "65-128", "4097-8192"]
    assert lines[1].endswith(" 3") and "█" * 40 in lines[1]  # the largest bin is the full width
    assert histogram(np.array([], dtype=np.int64)) == []


def test_two_column_file_round_trips_and_the_objective_reads_its_inputs(tmp_path):
    lengths = SampleLengths.of([12, 400, 7], [3, 9, 1])
    path = tmp_path / "lengths.tsv"
    write_tsv(lengths, path)
    assert path.read_text().splitlines()[:2] == ["# input\ttarget", "12\t3"]
    assert read_lengths_file(path) == lengths
    assert load_lengths(path) == [12, 400, 7]
    causal = SampleLengths.of([5, 6])
    write_tsv(causal, path)
    assert read_lengths_file(path) == causal and not read_lengths_file(path).seq2seq


def test_one_column_forms_still_read(tmp_path):
    path = tmp_path / "l.txt"
    path.write_text("12\n40, 7\n")
    assert read_lengths_file(path) == SampleLengths.of([12, 40, 7])
    path.write_text("[1, 2]")
    assert read_lengths_file(path).input.tolist() == [1, 2]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("1\t2\n3\n", "integer token counts"),
        ("1\t2\nx\ty\n", "integer token counts"),
        ("# only a header\n", "at least one"),
        ("1\t-2\n", "non-negative"),
    ],
)
def test_bad_lengths_files_are_one_line_naming_the_fix(tmp_path, text, match):
    path = tmp_path / "bad.tsv"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match) as err:
        read_lengths_file(path)
    assert "\n" not in str(err.value) and str(path) in str(err.value)
    with pytest.raises(ConfigError, match="does not exist"):
        read_lengths_file(tmp_path / "missing.tsv")


def test_sample_lengths_need_one_target_per_input():
    with pytest.raises(ConfigError, match="3 input lengths but 2 target"):
        SampleLengths.of([1, 2, 3], [1, 2])
