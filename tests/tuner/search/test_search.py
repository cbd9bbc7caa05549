"""The search driver's pieces that run for real without probes: the memory trace feeding the strategy."""

import optuna
import pytest

from trials.contract import ModelSpec
from tuner.job.objective import objective_for
from tuner.job.space import space_from_dict
from tuner.memory.frontier import Frontier
from tuner.memory.tracing import build_estimator, stage_order, trace_points
from tuner.search.request import SearchRequest, check_resume
from tuner.search.sampling import make_sampler
from tuner.search.strategy import SearchSetup, Strategy
from tuner.session.memory import shapes

MiB = 2**20


def test_trace_points_cover_min_and_max_micro_per_shape():
    space = space_from_dict(
        {"micro_batch_size": [1, 4, 32], "max_length": [64, 128], "gradient_checkpointing": [False, True]}
    )
    pts = trace_points(space)
    assert len(pts) == 2 * 2 * 2
    assert {p[0] for p in pts} == {1, 32}


def test_resume_rejects_only_explicit_contradictions():
    stored = {"world_size": 1, "space": {"a": 1}, "model": {"source": "builtin:tiny-t5"}}
    check_resume("s", stored, {"world_size": 2, "space": {"a": 1}}, explicit=set())  # defaults: stored wins
    with pytest.raises(Exception, match="different world_size"):
        check_resume("s", stored, {"world_size": 2}, explicit={"world_size"})


@pytest.mark.slow
def test_real_memory_trace_lets_the_strategy_skip_a_config_far_over_budget():
    space = space_from_dict(
        {"micro_batch_size": [2, 32], "max_length": [128], "zero_stage": [0], "gradient_checkpointing": [False]}
    )
    request = SearchRequest(
        study_name="t",
        storage="sqlite://",
        model=ModelSpec(),
        space=space,
        world_size=1,
        global_batch=32,
        objective=objective_for([128]),
        budget_s=600,
        device_memory=160 * MiB,
    )
    estimator, note = build_estimator(shapes(request), timeout_s=300)
    assert estimator is not None, note
    small = estimator.predict({"micro_batch_size": 2, "max_length": 128, "zero_stage": 0}).calibrated
    large = estimator.predict({"micro_batch_size": 32, "max_length": 128, "zero_stage": 0}).calibrated
    assert small < 160 * MiB < 1.5 * 160 * MiB < large
    strategy = Strategy(
        optuna.create_study(direction="maximize", sampler=make_sampler(0)),
        SearchSetup.of(request),
        estimator=estimator,
    )
    proposal = strategy.propose(600)
    assert proposal is not None and proposal.config.knobs.micro_batch_size == 2
    assert proposal.estimate_bytes == small
    inferred = strategy.drain()
    assert [r.knobs["micro_batch_size"] for r in inferred] in ([], [32])
    for _ in range(50):  # TPE draws micro 32 sooner or later; it must be recorded, never proposed
        p = strategy.propose(600)
        assert p is not None and p.config.knobs.micro_batch_size == 2
        if strategy.drain():
            break
    assert any(r.status == "inferred-oom" and "estimated peak" in r.cause for r in strategy.rows)

    # the same trace orders ZeRO stages for the frontier when the space spans several (one rank: stage 0 needs least)
    staged = space.restrict(zero_stage=[0, 1, 2, 3])
    order = stage_order(estimator, shapes(SearchRequest(**{**request.__dict__, "space": staged})))
    if order is not None:
        assert order[0] == min(order.values())
        strategy.use_frontier(Frontier(stage_need=order))
        assert strategy.frontier.stage_need == order
