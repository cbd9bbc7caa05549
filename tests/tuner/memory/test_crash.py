import itertools
import math

import numpy as np
import pytest

from tuner.job.lengths import SampleLengths
from tuner.job.padding import BatchShape, Collation
from tuner.memory.crash import crash_odds, samples_until_crash, staircase, unfit_share

GiB = 1 << 30


def quadratic_need(shape: BatchShape) -> float:
    """An attention-like need: weights plus a term in the batch's padded input and target lengths."""
    t = shape.target_length or 0
    return 1e6 + shape.batch * (shape.input_length**2 + 3 * t * t + 50 * shape.input_length * 1.0)


def brute_force_share(lengths: SampleLengths, b: int, col: Collation, need, limit: float) -> float:
    """Every ordered batch of b samples drawn with replacement, padded and checked."""
    clipped = col.clip(lengths)
    n = len(clipped)
    bad = 0
    for idx in itertools.product(range(n), repeat=b):
        tgt = None if clipped.target is None else max(int(clipped.target[i]) for i in idx)
        inp, t = col.pad(max(int(clipped.input[i]) for i in idx), tgt)
        bad += need(BatchShape(b, inp, t)) > limit
    return bad / n**b


@pytest.mark.parametrize("b", [1, 2, 3])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_share_matches_enumerating_every_batch(b, seed):
    rng = np.random.default_rng(seed)
    lengths = SampleLengths.of(rng.integers(1, 400, 9), rng.integers(1, 200, 9))
    limit = quadratic_need(BatchShape(b, 250, 120))
    for col in (Collation(), Collation(max_length=300, max_target_length=150)):
        assert unfit_share(lengths, b, col, quadratic_need, limit) == pytest.approx(
            brute_force_share(lengths, b, col, quadratic_need, limit)
        )


def test_causal_share_is_the_chance_a_batch_holds_a_too_long_sample():
    lengths = SampleLengths.of([10] * 9 + [1000])
    limit = quadratic_need(BatchShape(2, 500))
    assert unfit_share(lengths, 2, Collation(), quadratic_need, limit) == pytest.approx(1 - 0.9**2)


def test_staircase_is_the_longest_target_that_fits_per_input():
    fits = lambda a, t: a + t <= 10  # noqa: E731
    assert staircase(np.array([1, 5, 9, 12]), np.array([1, 2, 5, 9]), fits).tolist() == [9, 5, 1, -1]


def test_samples_until_the_first_crash_follow_the_geometric_law():
    # 1 batch in 410 on one rank, 2 samples a batch: median 284 batches, 90% within 943
    assert samples_until_crash(1 / 410, 2, 1, 0.5) == 2 * math.ceil(math.log(0.5) / math.log(1 - 1 / 410)) == 568
    assert samples_until_crash(1 / 410, 2, 1, 0.9) == 1886
    # four ranks draw four batches a step: a crash comes sooner in steps, about as soon in samples
    assert samples_until_crash(1 / 410, 2, 4, 0.5) == 8 * 71
    assert samples_until_crash(0.0, 2, 4, 0.5) is None
    assert samples_until_crash(1.0, 2, 4, 0.9) == 8


def test_the_crash_line_for_a_long_tail():
    lengths = SampleLengths.of([100] * 999 + [6000], [50] * 1000)
    limit = quadratic_need(BatchShape(2, 3000, 50))
    odds = crash_odds(lengths, 2, 4, Collation(), quadratic_need, limit)
    assert not odds.fits_worst and odds.worst == BatchShape(2, 6000, 50, padded=True)
    assert odds.unfit_share == pytest.approx(1 - 0.999**2)
    assert odds.describe().startswith("1 batch in 500 needs more than")
    assert f"crashes after about {odds.median_samples:,} samples (median; 90% within {odds.p90_samples:,})" in (
        odds.describe()
    )
    assert 600 < odds.median_samples < 800 and odds.p90_samples > 2000
    roomy = crash_odds(lengths, 2, 4, Collation(), quadratic_need, 100 * GiB)
    assert roomy.fits_worst and roomy.describe().startswith("every batch fits in 100.00 GiB (the worst, 2 x 6,000")
    none = crash_odds(lengths, 2, 4, Collation(), quadratic_need, 10)
    assert none.describe().endswith("crashes at its first step")


def test_a_config_that_fits_the_worst_batch_has_no_unfit_share_not_float_dust() -> None:
    """Found on a real study: 1 - sum(p^b - q^b) left 1e-16, '1 batch in 9,007,199,254,740,992'."""
    from tuner.job.lengths import SampleLengths
    from tuner.job.padding import Collation
    from tuner.memory.crash import crash_odds

    lengths = SampleLengths.of([27, 5, 13, 398, 33, 7, 19, 26] * 50, [3, 9, 13, 2, 8, 5, 11, 4] * 50)
    odds = crash_odds(lengths, 1, 1, Collation(), lambda b: 1e3 * b.batch * b.input_length, 40 << 20)
    assert odds.fits_worst and odds.unfit_share == 0 and odds.median_samples is None
    assert odds.describe().startswith("every batch fits in 40.0 MiB (the worst, 1 x 398 tokens")
