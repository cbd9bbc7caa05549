"""The explore phase's proposers as one pipeline: a list of stages, each a proposer (tuner.search.proposers) that owns
its done-state and says when it is asked; as Lightning's batch-size strategies each own their loop and their stop.

One proposal may take several tries: a config already measured, claimed by another worker or ruled out by the evidence
is told to Optuna without running and the next try follows. ``Pipeline.picks`` yields the tries in order:

- on the first try, the ``FRESH`` stages in order: ``opening`` (done once its bisection is settled), ``past_wall``
  (done once the wall is passed or nothing is left past it; only with ``Schedule.seed_bisection``), ``guided`` (its
  convergence ends the explore phase);
- after ``Schedule.stuck_asks`` missed tries in a row, the ``STUCK`` stage ``random_unknown`` (an unknown config at
  random, so the search cannot spin; with nothing unknown left, the space is exhausted); the count starts again after
  its pick;
- when no stage names a config, the study's sampler (TPE) proposes: the pipeline yields None.

Configs a stage rules out are handed to ``record`` at once, before the next stage is asked (the evidence then holds
them). Pure: the stages read the evidence; the caller asks and tells Optuna.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Literal

from trials.contract import Knobs
from tuner.search import proposers
from tuner.search.evidence import Evidence
from tuner.search.proposers import Context, Proposer
from tuner.search.schedule import Schedule
from tuner.search.setup import SearchSetup


class When(Enum):
    FRESH = "fresh"  # the first try of a proposal
    STUCK = "stuck"  # after Schedule.stuck_asks missed tries in a row


@dataclass
class Stage:
    """One proposer of the pipeline with its own done-state. ``final``: when it is done, nothing is left to explore."""

    name: str
    propose: Proposer
    when: When = When.FRESH
    final: bool = False
    done: bool = False

    def asked(self, missed: int, stuck_asks: int) -> bool:
        """Whether this stage is asked on a try after ``missed`` missed tries in a row."""
        return not self.done and (missed == 0 if self.when is When.FRESH else missed >= stuck_asks)


def stages(schedule: Schedule) -> list[Stage]:
    """The proposers of a search, in the order they are asked."""
    return [
        Stage("opening", proposers.opening),
        Stage("past_wall", proposers.past_wall, done=not schedule.seed_bisection),
        Stage("guided", proposers.guided),
        Stage("random_unknown", proposers.random_unknown, When.STUCK, final=True),
    ]


class Pipeline:
    """The stages over one search's context; ``stopped`` says why the explore phase is over ("converged": the guide
    expects no unprobed config to gain ``Schedule.min_expected_gain``; "exhausted": nothing unknown is left)."""

    def __init__(self, context: Context, pipeline: Sequence[Stage] | None = None) -> None:
        self.context = context
        self.stages = list(pipeline if pipeline is not None else stages(context.schedule))
        self.stopped: Literal["converged", "exhausted"] | None = None

    @classmethod
    def of(cls, setup: SearchSetup) -> Pipeline:
        """The default stages over ``setup``'s space and limits (the random stage seeded by ``setup.seed``)."""
        context = Context(
            space=setup.space,
            world_size=setup.world_size,
            global_batch=setup.global_batch,
            headroom=setup.headroom,
            device_memory=setup.device_memory,
            schedule=setup.schedule,
            rng=random.Random(setup.seed),
        )
        return cls(context)

    def picks(self, ev: Evidence, record: Callable[[Knobs], None]) -> Iterator[Knobs | None]:
        """The tries of one proposal: knobs to probe, or None for the sampler's pick. The caller takes the next one
        when a try missed (measured before, claimed elsewhere, ruled out); it ends when the explore phase is over."""
        missed = 0
        while self.stopped is None:
            pick = self._pick(ev, missed, record)
            if self.stopped is not None:
                return
            yield pick
            # a miss; one after the stuck stage's pick counts as the first of a new run of misses
            missed = 1 if missed >= self.context.schedule.stuck_asks else missed + 1

    def _pick(self, ev: Evidence, missed: int, record: Callable[[Knobs], None]) -> Knobs | None:
        for stage in self.stages:
            if not stage.asked(missed, self.context.schedule.stuck_asks):
                continue
            step = stage.propose(self.context, ev)
            for knobs in step.ruled_out:  # the OOM boundary, recorded once so `tuner trials` shows what never ran
                record(knobs)
            stage.done = stage.done or step.done
            if step.converged or (stage.final and stage.done):
                self.stopped = "converged" if step.converged else "exhausted"
                return None
            if step.knobs is not None:
                return step.knobs
        return None


__all__ = ["Pipeline", "Stage", "When", "stages"]
