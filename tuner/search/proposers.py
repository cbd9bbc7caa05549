"""Where the next config comes from: small proposal policies with one signature, ``(Context, Evidence) -> Proposed``,
as Lightning's batch-size strategies are small functions. The strategy (tuner.search.strategy) tries them in order:

1. ``opening``: a micro-batch bisection at the plainest config (or, with the memory estimate, one probe at the largest
   micro batch predicted stable);
2. ``guided``: the config of highest constrained expected improvement (tuner.search.guide), once a probe finished;
3. TPE: when neither names a config, the study's sampler proposes (nothing is enqueued);
4. ``random_unknown``: after ``Schedule.stuck_asks`` proposals in a row that were duplicates or ruled out, an unknown
   config at random, so the search cannot spin.

Pure: they read the evidence and never touch Optuna or storage. Configs they rule out are returned in
``Proposed.ruled_out``; the strategy records them as inferred-oom trials.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from trials.contract import Knobs
from tuner.job.batching import accumulation_steps
from tuner.job.space import Space, config_key
from tuner.search.evidence import Evidence
from tuner.search.guide import guide_step
from tuner.search.sampling import PlainSuggester
from tuner.search.schedule import Schedule


@dataclass
class Context:
    """What every proposer reads besides the evidence: the space (and its grid), the batch arithmetic and limits."""

    space: Space
    world_size: int
    global_batch: int
    headroom: float
    device_memory: int | None
    schedule: Schedule
    rng: random.Random
    _grid: list[Knobs] | None = field(default=None, repr=False)

    @property
    def grid(self) -> list[Knobs]:
        """Every config of the space (enumerated once, on first use)."""
        if self._grid is None:
            self._grid = list(self.space.configs())
        return self._grid

    def accum(self, knobs: Knobs) -> int:
        return accumulation_steps(self.global_batch, knobs.micro_batch_size, self.world_size) or 0

    def key(self, knobs: Knobs) -> str:
        return config_key(knobs, self.world_size, self.accum(knobs))


@dataclass
class Proposed:
    knobs: Knobs | None = None  # the config to probe next; None: this policy names none
    ruled_out: list[Knobs] = field(default_factory=list)  # to record as inferred-oom, never run
    done: bool = False  # this policy has nothing more to propose in this search
    converged: bool = False  # the guide expects no unprobed config to gain (Schedule.min_expected_gain)


Proposer = Callable[[Context, Evidence], Proposed]


def opening(ctx: Context, ev: Evidence) -> Proposed:
    """Bisection over the micro batch at the plainest config (lowest overhead: lowest ZeRO stage, no checkpointing,
    no offload): the largest micro batch that fits there is usually the fastest config, and each probe settles half of
    the remaining micro batches through the frontier. With the memory estimate, one probe at the largest micro batch
    predicted stable (and the boundary of what the estimate rules out goes on record)."""
    if not ctx.schedule.seed_bisection:
        return Proposed()
    known = ev.known()
    unknown = [
        k
        for k in (ctx.space.sample(PlainSuggester(m)) for m in sorted(ctx.space.micro_batch_size))
        if ctx.key(k) not in known and ev.frontier.infer(k) is None
    ]
    if not unknown:
        return Proposed(done=True)
    memory = ctx.device_memory
    limit = ctx.headroom * memory if memory else None
    if ev.estimator is None or not limit or not memory:
        return Proposed(unknown[len(unknown) // 2])
    estimates = {k.micro_batch_size: ev.estimate(k) for k in unknown}
    margin = ctx.schedule.estimate_margin * memory
    far = [k for k in unknown if (est := estimates[k.micro_batch_size]) is not None and est > margin]
    fitting = [k for k in unknown if (est := estimates[k.micro_batch_size]) is not None and est <= limit]
    return Proposed(fitting[-1] if fitting else unknown[0], ruled_out=far[:1], done=True)


def guided(ctx: Context, ev: Evidence) -> Proposed:
    """The config with the highest constrained expected improvement (tuner.search.guide), once a probe has finished;
    nothing (TPE proposes) before that or with ``Schedule.guide`` off."""
    if not ctx.schedule.guide:
        return Proposed()
    step = guide_step(
        ctx.grid,
        ev.rows,
        ev.frontier,
        ev.estimate if ev.estimator is not None else None,
        known=ev.known(),
        key=ctx.key,
        capacity=ev.capacity,
        headroom=ctx.headroom,
        estimate_margin=ctx.schedule.estimate_margin,
    )
    # the OOM boundary is recorded once, so `tuner trials` shows what was never probed
    choice = step.choice
    if choice is not None and step.best is not None and choice.score < ctx.schedule.min_expected_gain:
        return Proposed(ruled_out=step.ruled_out, done=True, converged=True)
    return Proposed(choice.knobs if choice is not None else None, ruled_out=step.ruled_out)


def random_unknown(ctx: Context, ev: Evidence) -> Proposed:
    """Any config not probed, not claimed and not ruled out by the frontier, at random; done when none is left."""
    known = ev.known()
    fresh = [k for k in ctx.grid if ctx.key(k) not in known and ev.frontier.infer(k) != "oom"]
    return Proposed(ctx.rng.choice(fresh)) if fresh else Proposed(done=True)


__all__: Sequence[str] = ["Context", "Proposed", "Proposer", "guided", "opening", "random_unknown"]
