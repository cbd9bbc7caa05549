import pytest

from trials.contract import ProbeResult
from tuner.errors import ConfigError
from tuner.job.objective import Objective, load_lengths, objective_for


def test_one_max_length_means_samples_per_second():
    obj = objective_for([128])
    assert obj.kind == "samples_per_s"
    assert obj.value(10.0, 128) == 10.0


def test_varying_max_length_counts_retained_tokens_without_dataset():
    obj = objective_for([128, 256])
    assert obj.kind == "retained_tokens_per_s"
    assert obj.value(10.0, 256) == 2560.0


def test_retained_tokens_use_the_length_distribution():
    obj = objective_for([64, 128, 512], lengths=[50, 100, 200, 400])
    assert obj.retained_tokens(64) == pytest.approx((50 + 64 * 3) / 4)
    assert obj.retained_tokens(128) == pytest.approx((50 + 100 + 128 * 2) / 4)
    assert obj.retained_tokens(512) == pytest.approx((50 + 100 + 200 + 400) / 4)


def test_truncation_cannot_win_by_processing_fewer_tokens():
    # 64 tokens run 3x more samples/s than 512 but keep far less of data that is ~400 tokens long
    obj = objective_for([64, 512], lengths=[400] * 10)
    assert obj.value(30.0, 64) < obj.value(10.0, 512)


def test_non_ok_results_have_no_objective():
    obj = Objective()
    assert obj.of(ProbeResult(status="oom"), 128) is None
    assert obj.of(ProbeResult(status="ok", samples_per_s=4.0), 128) == 4.0


def test_round_trip():
    obj = objective_for([64, 128], lengths=[3, 1, 2])
    again = Objective.from_dict(obj.to_dict())
    assert again.lengths == (1, 2, 3) and again.retained_tokens(2) == obj.retained_tokens(2)


def test_load_lengths(tmp_path):
    p = tmp_path / "l.txt"
    p.write_text("12\n40, 7\n")
    assert load_lengths(p) == [12, 40, 7]
    p.write_text("[1, 2]")
    assert load_lengths(p) == [1, 2]
    p.write_text("12\nabc\n")
    with pytest.raises(ConfigError):
        load_lengths(p)
    with pytest.raises(ConfigError):
        load_lengths(tmp_path / "missing")


def test_with_data_the_objective_says_it_is_on_drawn_batches_and_a_fixed_one_is_stored_as_before():
    fixed = objective_for([128])
    assert fixed.to_dict() == {"kind": "samples_per_s", "lengths": []} and fixed.unit == "samples/s"
    drawn = objective_for([128], drawn=True)
    assert drawn.unit == "samples/s on drawn batches"
    assert Objective.from_dict(drawn.to_dict()) == drawn
    tokens = objective_for([64, 128], lengths=[10, 200], drawn=True)
    assert tokens.unit == "retained tokens/s on drawn batches"
    assert tokens.value(2.0, 64) == 2.0 * (10 + 64) / 2  # samples/s on drawn batches x the tokens a sample keeps
