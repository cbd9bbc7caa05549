"""The proposer pipeline's order, done-states and stops (tuner.search.pipeline), with scripted stages."""

from __future__ import annotations

import random
from collections.abc import Iterator

from trials.contract import Knobs
from tuner.job.space import space_from_dict
from tuner.search.evidence import Evidence
from tuner.search.pipeline import Pipeline, Stage, When, stages
from tuner.search.proposers import Context, Proposed
from tuner.search.schedule import Schedule


def knobs(micro: int) -> Knobs:
    return Knobs(micro_batch_size=micro, max_length=64)


def context(schedule: Schedule) -> Context:
    space = space_from_dict({"micro_batch_size": [1, 2, 4, 8], "max_length": [64]})
    return Context(space, 1, 8, 0.9, None, schedule, random.Random(0))


class Script:
    """A stage's policy that answers from a list and logs every time it is asked."""

    def __init__(self, name: str, log: list[str], *answers: Proposed) -> None:
        self.name, self.log, self.answers = name, log, list(answers)

    def __call__(self, ctx: Context, ev: Evidence) -> Proposed:
        self.log.append(self.name)
        return self.answers.pop(0) if self.answers else Proposed()


def tries(pipeline: Pipeline, n: int, recorded: list[Knobs] | None = None) -> list[Knobs | None]:
    """The first ``n`` tries of one proposal (every one missed), or fewer when the pipeline stops."""
    found: Iterator[Knobs | None] = pipeline.picks(Evidence(), (recorded if recorded is not None else []).append)
    out = []
    for pick in found:
        out.append(pick)
        if len(out) == n:
            break
    return out


def test_fresh_stages_on_the_first_try_then_the_sampler_then_the_stuck_stage_once_per_stuck_asks() -> None:
    log: list[str] = []
    pipeline = Pipeline(
        context(Schedule(stuck_asks=2)),
        [
            Stage("a", Script("a", log)),
            Stage("b", Script("b", log, Proposed(knobs(4)))),
            Stage("r", Script("r", log, Proposed(knobs(1)), Proposed(knobs(2))), When.STUCK, final=True),
        ],
    )
    # try 1: a names none, b names 4; try 2 (1 missed): the sampler (None); try 3 (2 missed): r; its pick restarts the
    # count, so try 4 (1 missed) is the sampler's, try 5 (2 missed) r's again, try 6 the sampler's
    assert tries(pipeline, 6) == [knobs(4), None, knobs(1), None, knobs(2), None]
    assert log == ["a", "b", "r", "r"]


def test_a_done_stage_is_not_asked_again_and_ruled_out_configs_are_recorded_before_the_next_stage() -> None:
    log: list[str] = []
    recorded: list[Knobs] = []

    def first(ctx: Context, ev: Evidence) -> Proposed:
        log.append(f"first (recorded {len(recorded)})")
        return Proposed(ruled_out=[knobs(4)], done=True)

    def second(ctx: Context, ev: Evidence) -> Proposed:
        log.append(f"second (recorded {len(recorded)})")
        return Proposed(knobs(2))

    opening = Stage("opening", first)
    pipeline = Pipeline(context(Schedule()), [opening, Stage("second", second)])
    assert tries(pipeline, 1, recorded) == [knobs(2)] and opening.done and recorded == [knobs(4)]
    assert tries(pipeline, 1, recorded) == [knobs(2)]  # the next proposal: the opening is done, not asked
    assert log == ["first (recorded 0)", "second (recorded 1)", "second (recorded 1)"]
    assert pipeline.stopped is None


def test_convergence_stops_the_explore_phase_for_good() -> None:
    log: list[str] = []
    guide = Script("guide", log, Proposed(ruled_out=[knobs(8)], done=True, converged=True))
    pipeline = Pipeline(context(Schedule()), [Stage("guide", guide)])
    recorded: list[Knobs] = []
    assert tries(pipeline, 3, recorded) == [] and recorded == [knobs(8)]
    assert pipeline.stopped == "converged"
    assert tries(pipeline, 3) == [] and log == ["guide"]


def test_the_final_stage_done_means_the_space_is_exhausted() -> None:
    log: list[str] = []
    last = Stage("random", Script("random", log, Proposed(done=True)), When.STUCK, final=True)
    pipeline = Pipeline(context(Schedule(stuck_asks=1)), [last])
    assert tries(pipeline, 5) == [None]  # the sampler's first try, then nothing unknown is left
    assert pipeline.stopped == "exhausted" and log == ["random"]


def test_the_default_stages_and_the_wall_only_with_the_opening() -> None:
    names = [(s.name, s.when, s.final, s.done) for s in stages(Schedule())]
    assert names == [
        ("opening", When.FRESH, False, False),
        ("past_wall", When.FRESH, False, False),
        ("guided", When.FRESH, False, False),
        ("random_unknown", When.STUCK, True, False),
    ]
    assert [s.name for s in stages(Schedule(seed_bisection=False)) if s.done] == ["past_wall"]
