import pytest

from tuner.errors import ConfigError
from tuner.job.batching import accumulation_steps, default_global_batch, reachable_micro_batches, require_reachable


def test_accumulation_reaches_the_global_batch_exactly():
    assert accumulation_steps(32, 4, 1) == 8
    assert accumulation_steps(32, 4, 2) == 4
    assert accumulation_steps(32, 32, 1) == 1
    for micro in (1, 2, 4, 8, 16):
        accum = accumulation_steps(64, micro, 4)
        assert accum is not None and micro * accum * 4 == 64


def test_unreachable_global_batch_is_none_never_shrunk():
    assert accumulation_steps(32, 3, 1) is None
    assert accumulation_steps(32, 64, 1) is None  # would need accum 0.5
    assert accumulation_steps(24, 8, 2) is None  # 24 / 16 is not whole
    assert accumulation_steps(0, 1, 1) is None


def test_reachable_micro_batches_filters_the_choices():
    assert reachable_micro_batches([1, 2, 3, 4, 8, 16, 32], 16, 2) == [1, 2, 4, 8]


def test_require_reachable_says_how_to_fix():
    with pytest.raises(ConfigError) as err:
        require_reachable([16, 32], 24, 1)
    assert "global batch 24" in str(err.value)


def test_default_global_batch_is_reachable_by_every_choice():
    g = default_global_batch([1, 2, 4, 8, 16, 32], 2)
    assert g == 64
    assert reachable_micro_batches([1, 2, 4, 8, 16, 32], g, 2) == [1, 2, 4, 8, 16, 32]
