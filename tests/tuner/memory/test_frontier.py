"""The feasibility frontier: dominance order per knob, inference both ways, self-correction on contradictions."""

from __future__ import annotations

import itertools

import pytest
from pydantic import ValidationError

from tuner.memory.frontier import DEFAULT_ORDER, Frontier, needs_at_least, normalize, split

ZERO = {**DEFAULT_ORDER, "zero_stage": "down"}


def k(**kw: object) -> dict[str, object]:
    base: dict[str, object] = {"micro_batch_size": 4, "max_length": 128, "zero_stage": 1}
    base.update(kw)
    return normalize(base)


@pytest.mark.parametrize(
    "bigger, smaller",
    [
        (k(micro_batch_size=8), k(micro_batch_size=4)),
        (k(max_length=256), k(max_length=128)),
        (k(zero_stage=0), k(zero_stage=2)),
        (k(zero_stage=1), k(zero_stage=3)),
        (k(offload_optimizer=False), k(offload_optimizer=True)),
        (k(gradient_checkpointing=False), k(gradient_checkpointing=True)),
        (k(reduce_bucket_size=int(5e8)), k(reduce_bucket_size=int(5e7))),
        (k(allgather_bucket_size=None), k(allgather_bucket_size=int(2e8))),  # None = DeepSpeed's 5e8
        (k(eval_batch_size=8), k(eval_batch_size=None)),
        (k(eval_batch_size=8, generate=True), k(eval_batch_size=8)),
        (k(micro_batch_size=8, max_length=256, zero_stage=0), k(micro_batch_size=2, zero_stage=2)),
    ],
)
def test_order_per_knob(bigger: dict, smaller: dict) -> None:
    assert needs_at_least(bigger, smaller, ZERO)
    assert not needs_at_least(smaller, bigger, ZERO)


def test_zero_stage_unordered_by_default() -> None:
    assert not needs_at_least(k(zero_stage=0), k(zero_stage=2))
    assert not needs_at_least(k(zero_stage=2), k(zero_stage=0))
    f = Frontier()
    f.add(k(micro_batch_size=4, zero_stage=1), fits=False)
    assert f.infer(k(micro_batch_size=4, zero_stage=0)) is None
    assert Frontier(zero_order=True).order["zero_stage"] == "rank"


@pytest.mark.parametrize(
    "a, b",
    [
        (k(overlap_comm=True), k(overlap_comm=False)),
        (k(contiguous_gradients=False), k(contiguous_gradients=True)),
        (k(precision="bf16"), k(precision="fp32")),
        (k(alloc_conf="expandable_segments:True"), k()),
        (k(engine="torch", zero_stage=0), k(zero_stage=0)),  # plain torch is not ordered against DeepSpeed stage 0
        (k(micro_batch_size=8, max_length=64), k(micro_batch_size=4, max_length=128)),  # mixed directions
    ],
)
def test_unordered_pairs(a: dict, b: dict) -> None:
    assert not needs_at_least(a, b)
    assert not needs_at_least(b, a)


def test_buckets_only_compared_under_zero() -> None:
    # stage 0 has no buckets: different bucket values are the same stage-0 config as far as memory goes
    assert needs_at_least(k(zero_stage=0, reduce_bucket_size=10), k(zero_stage=0, reduce_bucket_size=10**9))
    # stage 0 vs stage 2 (with the stage order): ordered by stage whatever stage 2's buckets are
    assert needs_at_least(k(zero_stage=0), k(zero_stage=2, reduce_bucket_size=10**9), ZERO)
    # both ZeRO: buckets matter
    assert not needs_at_least(k(zero_stage=1, reduce_bucket_size=10), k(zero_stage=2, reduce_bucket_size=10**9), ZERO)


def test_preorder_on_a_grid() -> None:
    grid = [
        k(micro_batch_size=m, max_length=s, zero_stage=z, reduce_bucket_size=b, gradient_checkpointing=c)
        for m, s, z, b, c in itertools.product([1, 4], [64, 128], [0, 1, 2], [10, 1000], [False, True])
    ]
    for a in grid:
        assert needs_at_least(a, a)
    for order in (DEFAULT_ORDER, ZERO):
        # every chain a >= b >= c of the grid (distinct configs), not a sample: each must give a >= c
        above = {i: {j for j, b in enumerate(grid) if needs_at_least(a, b, order)} for i, a in enumerate(grid)}
        chains = [(i, j, m) for i in above for j in above[i] - {i} for m in above[j] - {i, j}]
        strict = [(i, j, m) for i, j, m in chains if i not in above[j] and j not in above[m]]  # a > b > c
        assert len(strict) > 100, "the order relates too few configs of the grid to test transitivity"
        assert [(i, m) for i, _, m in chains if m not in above[i]] == []


def test_oom_propagates_up_and_fits_down() -> None:
    f = Frontier(zero_order=True)
    f.add(k(micro_batch_size=8), fits=False)
    f.add(k(micro_batch_size=2), fits=True)
    assert f.infer(k(micro_batch_size=16)) == "oom"
    assert f.infer(k(micro_batch_size=8, max_length=512, zero_stage=0)) == "oom"
    assert f.infer(k(micro_batch_size=1)) == "fits"
    assert f.infer(k(micro_batch_size=2, zero_stage=3, gradient_checkpointing=True)) == "fits"
    assert f.infer(k(micro_batch_size=4)) is None  # between the two: must be probed
    assert f.infer(k(micro_batch_size=16, gradient_checkpointing=True)) is None  # checkpointing could save it
    assert f.infer(k(micro_batch_size=16, overlap_comm=True)) is None  # unordered knob differs
    assert f.explain(k(micro_batch_size=16)).startswith("inferred-oom from measured micro=8")
    assert f.explain(k(micro_batch_size=4)) is None
    assert len(f) == 2 and not f.conflicts


def test_split_partitions_candidates() -> None:
    f = Frontier()
    f.add(k(micro_batch_size=4, max_length=256), fits=False)
    f.add(k(micro_batch_size=2, max_length=128), fits=True)
    cands = [k(micro_batch_size=m, max_length=s) for m in (1, 2, 4, 8) for s in (128, 256)]
    parts = split(cands, f)
    assert {(c["micro_batch_size"], c["max_length"]) for c in parts["oom"]} == {(4, 256), (8, 256)}
    assert {(c["micro_batch_size"], c["max_length"]) for c in parts["fits"]} == {(1, 128), (2, 128)}
    assert len(parts["unknown"]) == 4


def test_contradiction_demotes_the_rule_and_withholds_answers() -> None:
    f = Frontier(zero_order=True)
    # on one rank, ZeRO-1 can need MORE than stage 0 (fp32 partition copy, nothing partitioned)
    f.add(k(micro_batch_size=4, zero_stage=1), fits=False)
    assert f.infer(k(micro_batch_size=4, zero_stage=0)) == "oom"  # what the documented rule says
    f.add(k(micro_batch_size=4, zero_stage=0), fits=True)  # ...and the measurement says otherwise
    assert len(f.conflicts) == 1 and f.conflicts[0].demoted == ("zero_stage",)
    assert f.order["zero_stage"] == "equal" and Frontier(zero_order=True).order["zero_stage"] == "rank"
    # the stage order is no longer used; the micro-batch order still is
    assert f.infer(k(micro_batch_size=8, zero_stage=0)) is None
    assert f.infer(k(micro_batch_size=8, zero_stage=1)) == "oom"
    assert f.infer(k(micro_batch_size=2, zero_stage=0)) == "fits"


def test_same_config_both_ways_gives_no_answer() -> None:
    f = Frontier()
    f.add(k(), fits=True)
    f.add(k(), fits=False)  # e.g. fragmentation noise on a real GPU
    assert f.infer(k()) is None
    assert f.conflicts and f.conflicts[0].demoted == ()


def test_invalid_knobs_are_rejected() -> None:
    with pytest.raises(ValidationError):
        normalize({"micro_batch_size": 1, "max_length": 8, "zero_stage": 0, "offload_optimizer": True})
    with pytest.raises(ValidationError):
        normalize({"micro_batch_size": 1, "max_length": 8, "no_such_knob": 1})


def test_stage_need_orders_stages_any_way() -> None:
    # small model, one rank: ZeRO only adds buffers; stage 1 needs the most, then 2, then 0 (measured 50.2/47.6/40.6)
    need = {0: 0, 2: 1, 1: 2}
    f = Frontier(stage_need=need)
    f.add(k(micro_batch_size=8, zero_stage=0), fits=False)
    assert f.infer(k(micro_batch_size=8, zero_stage=1)) == "oom"
    assert f.infer(k(micro_batch_size=8, zero_stage=2)) == "oom"
    assert f.infer(k(micro_batch_size=8, zero_stage=3)) is None  # not in the order: compared only with itself
    f.add(k(micro_batch_size=4, zero_stage=1), fits=True)
    assert f.infer(k(micro_batch_size=4, zero_stage=2)) == "fits"
    assert f.infer(k(micro_batch_size=2, zero_stage=0)) == "fits"
    assert not f.conflicts
    assert needs_at_least(k(zero_stage=1), k(zero_stage=0), f.order, need)
    assert not needs_at_least(k(zero_stage=0), k(zero_stage=1), f.order, need)
    tie = {0: 0, 1: 1, 2: 1}  # equal rank: neither is known to need more
    assert not needs_at_least(k(zero_stage=1), k(zero_stage=2), f.order, tie)
    assert not needs_at_least(k(zero_stage=2), k(zero_stage=1), f.order, tie)
    assert needs_at_least(k(zero_stage=2), k(zero_stage=0), f.order, tie)
