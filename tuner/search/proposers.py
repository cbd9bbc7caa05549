"""Where the next config comes from: small proposal policies with one signature, ``(Context, Evidence) -> Proposed``,
as Lightning's batch-size strategies are small functions. The pipeline (tuner.search.pipeline) asks them in order,
each as a stage that owns its done-state:

1. ``opening``: a micro-batch bisection at the plainest config (or, with the memory estimate, one probe at the largest
   micro batch predicted stable);
2. ``past_wall``: past the incumbent's memory wall (tuner.search.memory_wall), after the opening;
3. ``guided``: the config of highest constrained expected improvement (tuner.search.guide), once a probe finished;
4. TPE: when none names a config, the study's sampler proposes (nothing is enqueued);
5. ``random_unknown``: after ``Schedule.stuck_asks`` proposals in a row that were duplicates or ruled out, an unknown
   config at random, so the search cannot spin.

Pure: they read the evidence and never touch Optuna or storage. Configs they rule out are returned in
``Proposed.ruled_out``; the strategy records them as inferred-oom trials.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trials.contract import BUCKET_KNOBS, Knobs
from tuner.job.batching import accumulation_steps
from tuner.job.space import Space, config_key
from tuner.search.evidence import Evidence, fits
from tuner.search.guide import guide_step
from tuner.search.memory_wall import next_past_wall
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
    the remaining micro batches through the frontier. When the plainest setting does not fit even at its smallest micro
    batch, the opening walks to the feasible corner (``relief_path``): the memory-saving move of most memory freed per
    throughput lost, tested at its smallest micro batch, then bisected upwards. With the memory estimate, one probe at
    the largest micro batch predicted stable (and the boundary of what the estimate rules out goes on record)."""
    if not ctx.schedule.seed_bisection:
        return Proposed()
    if ev.estimator is not None and ctx.device_memory:
        return _estimated_opening(ctx, ev)
    settings = _settings(ctx.grid)
    plainest = ctx.space.sample(PlainSuggester(min(ctx.space.micro_batch_size)))
    path = relief_path(_setting(plainest), settings, lambda k: _verdict(ctx, ev, k), ctx.world_size)
    if path is None:
        return Proposed(done=True)
    setting, first = path
    known = ev.known()
    unknown = [k for k in settings[setting] if ctx.key(k) not in known and ev.frontier.infer(k) is None]
    if not unknown:
        return Proposed(done=True)
    if not first:
        return Proposed(unknown[len(unknown) // 2])
    # a relief move: first see whether it fits at all, then bisect upwards from there, on the low side (memory is
    # tight: the plainest setting did not fit at all)
    return Proposed(unknown[0] if unknown[0] is settings[setting][0] else unknown[(len(unknown) - 1) // 2])


def _estimated_opening(ctx: Context, ev: Evidence) -> Proposed:
    known = ev.known()
    unknown = [
        k
        for k in (ctx.space.sample(PlainSuggester(m)) for m in sorted(ctx.space.micro_batch_size))
        if ctx.key(k) not in known and ev.frontier.infer(k) is None
    ]
    if not unknown:
        return Proposed(done=True)
    memory = ctx.device_memory
    assert memory is not None
    limit = ctx.headroom * memory
    estimates = {k.micro_batch_size: ev.estimate(k) for k in unknown}
    margin = ctx.schedule.estimate_margin * memory
    far = [k for k in unknown if (est := estimates[k.micro_batch_size]) is not None and est > margin]
    fitting = [k for k in unknown if (est := estimates[k.micro_batch_size]) is not None and est <= limit]
    return Proposed(fitting[-1] if fitting else unknown[0], ruled_out=far[:1], done=True)


# Memory-saving moves of the opening, as prior (log memory freed, log throughput lost): a halving of the length frees
# about half the activations at little cost per token; checkpointing frees most activations for a recompute (~1/3 of
# the step); a higher ZeRO stage partitions model states over the ranks (nothing on one rank, where its buffers cost
# memory) for some communication; offloading the optimizer frees its states for a host step, the slowest of them.
RELIEF: dict[str, tuple[float, float]] = {
    "max_length": (0.5, 0.02),
    "gradient_checkpointing": (0.7, 0.3),
    "zero_stage": (0.3, 0.1),  # per stage, scaled by 1 - 1/world_size
    "offload_optimizer": (0.3, 0.4),
}


def relief_moves(setting: str, settings: Mapping[str, Sequence[Knobs]], world_size: int) -> list[str]:
    """The settings one memory-saving move away from ``setting`` (a setting: every knob but the micro batch), the most
    memory freed per throughput lost first (``RELIEF``)."""
    here = json.loads(setting)
    scored: list[tuple[float, str]] = []
    for other in settings:
        there = json.loads(other)
        diff = {n for n in here if n not in BUCKET_KNOBS and here[n] != there.get(n)}
        if len(diff) != 1:
            continue
        (name,) = diff
        freed, lost = RELIEF.get(name, (0.0, 1.0))
        if name == "max_length" and not there[name] < here[name]:
            continue
        if name in ("gradient_checkpointing", "offload_optimizer") and not (there[name] and not here[name]):
            continue
        if name == "zero_stage":
            steps = int(there[name] or 0) - int(here[name] or 0)
            if steps <= 0 or world_size < 2:
                continue
            freed, lost = freed * steps * (1 - 1 / world_size), lost * steps
        if name not in RELIEF or any(there.get(b) != _smallest(settings, b, there) for b in BUCKET_KNOBS):
            continue
        scored.append((freed / lost, other))
    return [o for _, o in sorted(scored, key=lambda t: -t[0])]


def relief_path(
    start: str,
    settings: Mapping[str, Sequence[Knobs]],
    verdict: Callable[[Knobs], str | None],
    world_size: int,
) -> tuple[str, bool] | None:
    """The setting the opening works on: ``start`` while it may fit; once it does not fit at its smallest micro batch
    (``verdict`` "oom": measured or inferred OOM or above the headroom), the best-ranked relief move that may fit
    (``relief_moves``), and from the best-ranked one on when none may. Returns (setting, moved away from start), or
    None when the opening is over: a setting fits and nothing is left to bisect there, or nothing relieves enough."""
    current, moved, seen = start, False, {start}
    while True:
        micros = settings.get(current) or []
        if any(verdict(k) == "fits" for k in micros) or (micros and verdict(micros[0]) != "oom"):
            return current, moved
        moves = [m for m in relief_moves(current, settings, world_size) if m not in seen]
        if not moves:
            return None
        open_moves = [m for m in moves if verdict(settings[m][0]) != "oom"]
        current, moved = (open_moves or moves)[0], True
        seen.add(current)


def _verdict(ctx: Context, ev: Evidence, knobs: Knobs) -> str | None:
    """ "fits" / "oom" from the measured rows (above the headroom counts as not fitting) and the frontier."""
    key = ctx.key(knobs)
    for row in ev.rows:
        if row.config_key == key and row.measured:
            fitted = fits(row)
            if fitted is not None:
                return "fits" if fitted else "oom"
    return ev.frontier.infer(knobs)


def _setting(knobs: Knobs) -> str:
    return json.dumps({**knobs.model_dump(mode="json"), "micro_batch_size": None}, sort_keys=True)


def _settings(grid: Sequence[Knobs]) -> dict[str, list[Knobs]]:
    """The grid by setting (every knob but the micro batch), each setting's configs by micro batch."""
    out: dict[str, list[Knobs]] = {}
    for k in grid:
        out.setdefault(_setting(k), []).append(k)
    for configs in out.values():
        configs.sort(key=lambda k: k.micro_batch_size)
    return out


def _smallest(settings: Mapping[str, Sequence[Knobs]], bucket: str, like: Mapping[str, Any]) -> Any:
    """The smallest value of a bucket knob among the settings of the same ZeRO stage as ``like`` (None: unset)."""
    values = [
        v
        for s in settings
        if (d := json.loads(s))["zero_stage"] == like["zero_stage"] and (v := d.get(bucket)) is not None
    ]
    return min(values) if values else None


def past_wall(ctx: Context, ev: Evidence) -> Proposed:
    """After the opening: the incumbent's next micro batch up in a setting that frees the kind of memory that fills
    the device (tuner.search.memory_wall), until one fits; done when there is no wall or nothing left to try."""
    best = ev.best()
    capacity = ev.capacity
    if best is None or not capacity:
        return Proposed(done=True)
    known = ev.known()

    def verdict(k: Knobs) -> str | None:  # a known config without a memory verdict (it failed) is not retried
        found = _verdict(ctx, ev, k)
        return "oom" if found is None and ctx.key(k) in known else found

    found = next_past_wall(
        Knobs.model_validate(best.knobs),
        _settings(ctx.grid),
        ev.rows,
        verdict,
        ctx.headroom * capacity,
        RELIEF,
        ctx.world_size,
    )
    if isinstance(found, Knobs):
        return Proposed(found)
    return Proposed(done=True)


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


__all__: Sequence[str] = [
    "RELIEF",
    "Context",
    "Proposed",
    "Proposer",
    "guided",
    "opening",
    "past_wall",
    "random_unknown",
    "relief_moves",
    "relief_path",
]
