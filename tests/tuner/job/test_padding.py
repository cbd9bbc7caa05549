import pytest

from tuner.errors import ConfigError
from tuner.job.lengths import SampleLengths
from tuner.job.padding import (
    BatchShape,
    Collation,
    draw_batches,
    mean_tokens,
    real_tokens_per_sample,
    worst_batch,
)

LENGTHS = SampleLengths.of([10, 20, 30, 6000, 40, 50], [4, 90, 6, 8, 10, 12])


def test_worst_batch_pads_to_the_longest_input_and_target_with_no_truncation():
    assert worst_batch(LENGTHS, 2, Collation()) == BatchShape(2, 6000, 90, padded=True)
    assert worst_batch(LENGTHS, 2, Collation()).tokens == 2 * 6090


def test_a_length_limit_truncates_before_padding():
    assert worst_batch(LENGTHS, 2, Collation(max_length=512, max_target_length=16)) == BatchShape(
        2, 512, 16, padded=True
    )


def test_max_length_padding_pads_every_batch_to_the_limit():
    col = Collation(padding="max_length", max_length=128)
    assert worst_batch(LENGTHS, 4, col) == BatchShape(4, 128, 128, padded=True)
    assert {b.input_length for b in draw_batches(LENGTHS, 2, col, 5)} == {128}


def test_causal_lengths_have_no_label_side():
    causal = SampleLengths.of([3, 9, 4])
    assert worst_batch(causal, 1, Collation()) == BatchShape(1, 9, None)
    assert BatchShape(1, 9).describe() == "1 x 9 tokens"


def test_drawn_batches_are_seeded_shuffles_padded_to_their_own_longest():
    a = draw_batches(LENGTHS, 2, Collation(), 3, seed=7)
    assert a == draw_batches(LENGTHS, 2, Collation(), 3, seed=7)
    inputs = sorted(LENGTHS.input.tolist())
    # one epoch of 3 batches covers every sample once: exactly one batch holds the 6000-token sample
    assert sum(b.input_length == 6000 for b in a) == 1
    assert all(b.input_length in inputs for b in a)
    more = draw_batches(LENGTHS, 2, Collation(), 10, seed=1)  # past one epoch: a new shuffle
    assert len(more) == 10 and sum(b.input_length == 6000 for b in more) >= 3
    assert mean_tokens([BatchShape(2, 10, 5), BatchShape(2, 20, 5)]) == 40.0  # (2x15 + 2x25) / 2


def test_real_tokens_count_what_a_sample_keeps():
    assert real_tokens_per_sample(SampleLengths.of([10, 30], [2, 4]), Collation()) == 23.0
    assert real_tokens_per_sample(SampleLengths.of([10, 30], [2, 4]), Collation(max_length=20)) == 18.0


def test_bad_collations_name_the_fix():
    with pytest.raises(ConfigError, match="--max-length"):
        Collation(padding="max_length")
    with pytest.raises(ConfigError, match="longest, max_length"):
        Collation(padding="left")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="empty"):
        worst_batch(SampleLengths.of([]), 1, Collation())


def test_the_worst_batch_is_padded_where_the_collator_pads_it():
    """A padded batch is what makes a causal LM build its attention mask: the worst batch is padded when a shorter
    sample can share it (micro batch 2 or more) or padding to max_length pads its longest sample too."""
    same = SampleLengths.of([64, 64, 64])
    assert not worst_batch(same, 4, Collation()).padded  # every sample as long as the batch: no padding
    assert worst_batch(same, 4, Collation(padding="max_length", max_length=128)).padded
    assert not worst_batch(same, 4, Collation(max_length=32)).padded  # truncated to one length
    causal = SampleLengths.of([3, 9, 4])
    assert not worst_batch(causal, 1, Collation()).padded  # one sample fills its own batch
    assert worst_batch(causal, 2, Collation()).padded
    for b in draw_batches(causal, 2, Collation(), 6, seed=3):
        assert b.padded == (b.real_tokens is not None and b.real_tokens < 2 * b.input_length)


def test_a_data_job_pads_by_the_worst_batchs_rule():
    from tuner.job.data_job import DataJob

    assert DataJob(SampleLengths.of([3, 9, 4]), "mixed").pads
    assert not DataJob(SampleLengths.of([64, 64]), "one length").pads
    assert DataJob(SampleLengths.of([64, 64]), "one length", padding="max_length").pads
