"""tuner.search.guide: the throughput model and the constrained-EI choice of the next config (pure, no probes)."""

import math

import pytest

from trials.contract import Knobs
from tuner.records import ProbeRow
from tuner.search.guide import Featurizer, Model, PeakModel, _need, expected_improvement, next_config, p_stable


def k(micro, length=128, stage=0, ckpt=False):
    return Knobs(micro_batch_size=micro, max_length=length, zero_stage=stage, gradient_checkpointing=ckpt)


GRID = [k(m, s, z, c) for m in (1, 2, 4, 8, 16, 32) for s in (64, 128) for z in (0, 2) for c in (False, True)]


def speed(knobs):
    """Saturating in the micro batch, checkpointing costs 30%, ZeRO-2 5%, tokens/s falls with length."""
    m = knobs.micro_batch_size
    per_token = 1000 * m / (m + 4) * (0.7 if knobs.gradient_checkpointing else 1.0)
    return per_token * (0.95 if knobs.zero_stage == 2 else 1.0) * (128 / knobs.max_length) ** 0.3


def test_features_cover_only_the_knobs_that_vary():
    f = Featurizer([k(1), k(8, ckpt=True)])
    assert f.numeric == ["micro_batch_size"] and list(f.levels) == ["gradient_checkpointing"]
    assert f(k(1)).shape == (4,)  # offset, log2 micro, its square, checkpointing on
    assert f(k(4, ckpt=True))[-1] == 1.0 and f(k(4))[-1] == 0.0
    assert len(Featurizer(GRID)(k(4))) == len(Featurizer(GRID).prior_scales())


def test_model_learns_multiplicative_knob_effects_from_a_few_probes():
    measured = [(c, speed(c)) for c in (k(1), k(4), k(16), k(4, ckpt=True), k(4, stage=2), k(4, 64))]
    model = Model.fit(Featurizer(GRID), measured)
    ratio = math.exp(model.predict(k(16, ckpt=True))[0]) / math.exp(model.predict(k(16))[0])
    assert ratio == pytest.approx(0.7, rel=0.1)
    assert math.exp(model.predict(k(8))[0]) == pytest.approx(speed(k(8)), rel=0.1)  # between measured batches
    # measured configs are known better than unmeasured extremes
    assert model.predict(k(4))[1] < model.predict(k(32, 64, 2, True))[1]


def test_expected_improvement_is_positive_and_grows_with_mean_and_doubt():
    assert expected_improvement(0.0, 0.1, 0.0) > 0
    assert expected_improvement(0.1, 0.1, 0.0) > expected_improvement(0.0, 0.1, 0.0)
    assert expected_improvement(-0.2, 0.2, 0.0) > expected_improvement(-0.2, 0.05, 0.0)


def test_p_stable_trusts_the_frontier_then_the_estimate():
    assert p_stable(10**9, 100, "fits") == 1.0 and p_stable(1, 100, "oom") == 0.0
    assert p_stable(50, 100, None) > 0.99 and p_stable(150, 100, None) < 0.01
    assert 0.4 < p_stable(100, 100, None) < 0.6  # right on the headroom line: a coin flip
    assert 0 < p_stable(None, 100, None) < 1  # no estimate: a prior


def test_next_config_goes_for_the_largest_batch_that_fits_and_skips_the_rest():
    measured = [(c, speed(c)) for c in (k(2), k(8), k(2, ckpt=True), k(2, stage=2), k(2, 64))]
    fits = {16: 0.97, 32: 0.02}  # micro 32 is predicted over the headroom line

    choice = next_config(
        GRID,
        measured,
        best=max(v for _, v in measured),
        skip=lambda c: any(c == m for m, _ in measured),
        p_fit=lambda c: fits.get(c.micro_batch_size, 1.0),
    )
    assert choice is not None
    assert choice.knobs.micro_batch_size == 16 and not choice.knobs.gradient_checkpointing
    assert choice.knobs.zero_stage == 0 and choice.p_stable == pytest.approx(0.97)


def test_next_config_needs_a_measurement_and_a_candidate():
    assert next_config(GRID, [], None, skip=lambda c: False, p_fit=lambda c: 1.0) is None
    assert next_config(GRID, [(k(1), 10.0)], 10.0, skip=lambda c: True, p_fit=lambda c: 1.0) is None
    only_oom = next_config(GRID, [(k(1), 10.0)], 10.0, skip=lambda c: False, p_fit=lambda c: 0.0)
    assert only_oom is None


def test_near_ties_go_to_the_cheaper_probe():
    grid = [k(4, 64), k(4, 128)]
    measured = [(k(1, 64), 10.0), (k(1, 128), 10.0)]
    choice = next_config(
        grid,
        measured,
        None,
        skip=lambda c: False,
        p_fit=lambda c: 1.0,
        cost=lambda c: c.micro_batch_size * c.max_length,
    )
    assert choice.knobs.max_length == 64


def test_peak_model_predicts_the_memory_boundary_from_measured_peaks():
    def peak(c):  # states + micro x per-sample activations; checkpointing keeps a third
        return 10e6 + c.micro_batch_size * 4e6 * (c.max_length / 128) * (0.35 if c.gradient_checkpointing else 1.0)

    grid = [k(m, s, 0, c) for m in (1, 2, 4, 8, 16, 32) for s in (64, 128) for c in (False, True)]
    measured = [(c, peak(c)) for c in (k(1), k(8), k(2, 64), k(4, ckpt=True))]
    model = PeakModel(grid, measured, limit=60e6)
    assert model(k(2)) > 0.95 and model(k(8, 64)) > 0.8  # 18 MB, 26 MB: inside what was measured
    assert model(k(32)) < 0.3 and model(k(32, 64)) < 0.4  # 138 MB, 74 MB: over the line, far extrapolations
    assert model(k(32)) < model(k(16)) < model(k(8, 64)) < model(k(2))  # more memory, less chance
    assert model(k(16, ckpt=True)) > model(k(16))  # checkpointing lowers the need
    assert PeakModel(grid, measured[:1], limit=60e6)(k(4)) == pytest.approx(0.6)  # one peak: the prior


def test_peak_model_carries_what_one_bucket_size_taught_over_to_the_others():
    def z1(micro, bucket):
        return Knobs(
            micro_batch_size=micro, max_length=128, zero_stage=1, reduce_bucket_size=bucket, allgather_bucket_size=10**7
        )

    grid = [z1(m, b) for m in (1, 2, 4) for b in (10**7, 5 * 10**7, 2 * 10**8)] + [k(m) for m in (1, 2, 4)]
    # ZeRO-1 with the 1e7 bucket peaks at 70 MB, the 5e7 bucket ran out of memory (a need of at least 100 MB)
    measured = [(k(1), 30e6), (k(4), 40e6), (z1(1, 10**7), 70e6), (z1(4, 10**7), 75e6), (z1(1, 5 * 10**7), 100e6)]
    model = PeakModel(grid, measured, limit=90e6)
    assert model(z1(2, 10**7)) > 0.8
    # never probed: the 2e8 bucket is 4x the 5e7 one that did not fit, so it does not fit either (as one level of its
    # own it would be a coin flip)
    assert model(z1(1, 2 * 10**8)) < 0.1 and model(z1(4, 2 * 10**8)) < 0.1


def test_the_incumbent_pulls_the_search_towards_one_knob_moves():
    measured = [(k(4), 100.0), (k(2), 80.0)]
    near, far = k(4, stage=2), k(4, 64, 2, True)
    free = next_config([near, far], measured, 100.0, skip=lambda c: False, p_fit=lambda c: 1.0)
    local = next_config([near, far], measured, 100.0, skip=lambda c: False, p_fit=lambda c: 1.0, around=k(4))
    assert free.knobs == far  # the most uncertain config has the largest plain EI
    assert local.knobs == near


def test_a_larger_micro_batch_is_expected_faster_before_any_evidence():
    measured = [(k(4), 100.0), (k(4, ckpt=True), 70.0)]
    model = Model.fit(Featurizer(GRID), measured, slopes={"micro_batch_size": 0.15})
    assert model.predict(k(16))[0] > model.predict(k(4))[0] > model.predict(k(1))[0]


def test_switching_zero_on_with_the_smallest_buckets_is_one_move():
    from tuner.search.guide import _distance, _plainest

    def z(stage, bucket, micro=4, overlap=False):
        return Knobs(
            micro_batch_size=micro,
            max_length=128,
            zero_stage=stage,
            reduce_bucket_size=bucket,
            allgather_bucket_size=bucket,
            overlap_comm=overlap,
        )

    grid = [z(0, None), z(1, 2_000_000), z(1, 8_000_000), z(1, 2_000_000, overlap=True)]
    plain = _plainest(grid)
    assert _distance(z(1, 2_000_000), z(0, None), plain) == 1  # the stage
    assert _distance(z(1, 8_000_000), z(0, None), plain) == 3  # the stage and both buckets
    assert _distance(z(1, 2_000_000, overlap=True), z(0, None), plain) == 2
    assert _distance(z(0, None, micro=16), z(0, None), plain) == pytest.approx(1.0)  # two doublings, half a knob each


def test_an_oom_needs_what_the_device_refused_not_just_the_capacity():
    def row(**values):
        return ProbeRow.from_record({"config_key": "k", "fidelity": "short", "knobs": {}, **values})

    ranks = [{"rank": 0, "oom_need": 800 * 2**20}, {"rank": 1, "oom_need": None}]
    oom = {"status": "oom", "peak_allocated": 50 * 2**20}
    assert _need(row(**oom, result={"ranks": ranks}), capacity=160 * 2**20) == 800 * 2**20
    assert _need(row(**oom, result=None), capacity=160 * 2**20) == 160 * 2**20  # CUDA, older rows: the capacity
    assert _need(row(status="ok", peak_allocated=70, result={}), capacity=100) == 70
    assert _need(row(status="error"), capacity=100) is None


def test_the_speed_prior_says_checkpointing_costs_throughput():
    """Recomputing the forward costs about a third of a step: before any probe of both, the throughput model expects
    a checkpointed config slower than the same config without (issue 25: on the causal tables the guide climbed
    checkpointed settings first and found the plain one last). The data overrules it."""
    from tuner.search.regression import SPEED_SLOPES

    configs = [k(4), k(4, ckpt=True), k(8), k(8, ckpt=True)]
    f = Featurizer(configs)
    means = f.prior_means(SPEED_SLOPES)
    ckpt_feature = f(k(4, ckpt=True)) - f(k(4))
    assert float(means @ ckpt_feature) == pytest.approx(-0.3)
    plain_measured = [(k(4), 100.0), (k(8), 110.0)]
    model = Model.fit(f, plain_measured, slopes=SPEED_SLOPES)
    assert model.predict(k(8, ckpt=True))[0] < model.predict(k(8))[0]
