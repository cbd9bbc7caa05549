import pytest

from trials.contract import Knobs
from tuner.errors import ConfigError
from tuner.job.batching import (
    GLOBAL_BATCH_KEYWORDS,
    accumulation_steps,
    default_global_batch,
    reachable_micro_batches,
    require_reachable,
    validated_knobs,
)


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


def test_validated_knobs_names_the_bad_value_and_the_unreachable_global_batch_in_the_callers_words() -> None:
    knobs = validated_knobs({"micro_batch_size": 4, "max_length": 64}, 32, 2)
    assert isinstance(knobs, Knobs) and knobs.micro_batch_size == 4
    assert validated_knobs(knobs, None, 3) is knobs
    with pytest.raises(ConfigError, match=r"^--global-batch 30 is not a whole number .* --micro-batch-size x "):
        validated_knobs(knobs, 30, 2)
    with pytest.raises(ConfigError, match=r"^global_batch 30 .* = 8$"):
        validated_knobs(knobs, 30, 2, GLOBAL_BATCH_KEYWORDS)
    with pytest.raises(ConfigError, match=r"^micro_batch_size: "):
        validated_knobs({"micro_batch_size": 0, "max_length": 64}, None, 1)
