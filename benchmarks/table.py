"""A recorded probe table (benchmarks/record.py) and the simulated probing environment strategies run in.

A probe is a table lookup: one recorded repeat of the config, drawn by the seeded RNG on every visit (so strategies
see the timing noise), charged its recorded probe seconds. The table's truth for a config is the median objective
over its repeats; a config is stable only if every repeat was (tuner.search.selection's rule).
"""

from __future__ import annotations

import json
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trials.contract import Knobs, ModelSpec, ProbeResult
from tuner.job.objective import Objective
from tuner.job.space import Space, knobs_key
from tuner.memory.estimator import Estimator, Trace
from tuner.records import is_stable
from tuner.search.request import SearchRequest
from tuner.search.schedule import Schedule
from tuner.session.memory import MemoryModel, recorded


class OutOfBudget(Exception):
    """The next probe would pass the replay's probe-second budget."""


@dataclass
class Entry:
    knobs: Knobs
    repeats: list[dict[str, Any]]
    stable: bool
    value: float  # median objective over repeats (0 for configs that are not stable)
    mean_s: float  # mean probe seconds over repeats


@dataclass
class Table:
    name: str
    raw: dict[str, Any]
    space: Space
    objective: Objective
    entries: dict[str, Entry]
    order: list[str]  # grid order (the recorder's)

    @classmethod
    def load(cls, path: str | Path, truth: str = "median") -> Table:
        """``truth``: how a config's repeats become its true objective: "median", "max" (the uncontended speed: on a
        shared machine load only slows a probe down, the reasoning behind timeit's "use the min time") or "min"."""
        return cls.from_raw(json.loads(Path(path).read_text()), Path(path).stem, truth)

    @classmethod
    def from_raw(cls, raw: dict[str, Any], name: str, truth: str = "median") -> Table:
        """A table from its recorded JSON (``load``), or from one derived from it (benchmarks.tight)."""
        picks: dict[str, Callable[[list[float]], float]] = {"median": statistics.median, "max": max, "min": min}
        pick = picks[truth]
        space = _recorded_space(raw)
        objective = Objective(kind="retained_tokens_per_s" if len(space.max_length) > 1 else "samples_per_s")
        entries: dict[str, Entry] = {}
        order: list[str] = []
        for row in raw["rows"]:
            if not row["repeats"]:
                continue  # a table still being recorded
            knobs = Knobs.model_validate(row["knobs"])
            reps = row["repeats"]
            stable = all(
                is_stable(
                    r["status"],
                    r["peak_allocated"],
                    r.get("capacity") or raw["device_memory"],
                    raw["headroom"],
                    r.get("alloc_retries"),
                )
                for r in reps
            )
            vals = [objective.value(r["samples_per_s"], knobs.max_length) or 0.0 for r in reps]
            key = knobs_key(knobs)
            entries[key] = Entry(
                knobs,
                reps,
                stable,
                pick(vals) if stable else 0.0,
                statistics.fmean(float(r["probe_seconds"]) for r in reps),
            )
            order.append(key)
        return cls(name, raw, space, objective, entries, order)

    @property
    def model(self) -> ModelSpec:
        return ModelSpec.model_validate(self.raw["model"])

    @property
    def world_size(self) -> int:
        return int(self.raw["world_size"])

    @property
    def global_batch(self) -> int:
        return int(self.raw["global_batch"])

    @property
    def tracker_version(self) -> int:
        """1: recorded while the emulated device counted ZeRO-1/2's meta tensors (benchmarks.replay.tracker_artifacts);
        2: recorded since (benchmarks.record.TRACKER_VERSION)."""
        return int(self.raw.get("tracker_version", 1))

    @property
    def device_memory(self) -> int:
        return int(self.raw["device_memory"])

    @property
    def headroom(self) -> float:
        return float(self.raw["headroom"])

    @property
    def best(self) -> float:
        return max((e.value for e in self.entries.values() if e.stable), default=0.0)

    @property
    def grid_seconds(self) -> float:
        """What one pass over the full grid costs (one repeat per config, at its mean)."""
        return sum(e.mean_s for e in self.entries.values())

    def search_request(self, schedule: Schedule | None = None, seed: int | None = None) -> SearchRequest:
        """What `tuner search` would search for this table: its space, model, batch and memory limits."""
        return SearchRequest(
            study_name=self.name,
            storage="sqlite://",  # never opened: a replay's study lives in memory
            model=self.model,
            space=self.space,
            world_size=self.world_size,
            global_batch=self.global_batch,
            objective=self.objective,
            budget_s=self.grid_seconds,
            device_memory=self.device_memory,
            headroom=self.headroom,
            schedule=schedule or Schedule(),
            seed=seed,
        )

    def entry(self, knobs: Knobs) -> Entry:
        key = knobs_key(knobs)
        if key not in self.entries:
            raise KeyError(f"config not in table {self.name}: {knobs.model_dump()}")
        return self.entries[key]

    def configs(self) -> list[Knobs]:
        return [self.entries[k].knobs for k in self.order]

    def memory(self) -> MemoryModel | None:
        """From the trace of every grid point (to measure the estimator and the frontier on the table), built as a
        search builds its own (tuner.session.memory): the estimator, and the frontier's ZeRO stage order."""
        tr = self.raw.get("trace")
        return recorded(Trace.model_validate(tr), self.search_request()) if tr else None

    def estimator(self) -> Estimator | None:
        memory = self.memory()
        return memory.estimator if memory is not None else None

    def search_memory(self, request: SearchRequest) -> tuple[MemoryModel, float] | None:
        """What `tuner search` would start from (tuner.session.memory): the estimator and ZeRO-ordering frontier of
        the trace of tuner.memory.tracing.trace_points only, and the trace's wall seconds."""
        st = self.raw.get("search_trace")
        if not st:
            return None
        return recorded(Trace.model_validate(st["trace"]), request), float(st["seconds"])


@dataclass
class Env:
    """One replay run: a seeded lookup probe, a probe-second clock, and the strategy's pick over time."""

    table: Table
    seed: int
    budget_s: float
    rng: random.Random = field(init=False)
    clock: float = 0.0
    overhead_s: float = 0.0  # charged outside probes (the memory trace)
    probes: list[tuple[str, int, str, float]] = field(default_factory=list)  # (key, repeat, status, seconds)
    timeline: list[tuple[float, str | None]] = field(default_factory=list)  # (clock, picked key)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    @property
    def seconds_left(self) -> float:
        return self.budget_s - self.clock

    def probe(self, knobs: Knobs, cost_factor: float = 1.0) -> ProbeResult:
        """Draws one recorded repeat of ``knobs``; ``cost_factor`` scales the measuring part (longer probes)."""
        entry = self.table.entry(knobs)
        i = self.rng.randrange(len(entry.repeats))
        rep = entry.repeats[i]
        wall = float(rep["probe_seconds"])
        setup = float(rep.get("setup_s") or 0.0)
        seconds = setup + max(wall - setup, 0.0) * cost_factor
        if self.clock + seconds > self.budget_s:
            raise OutOfBudget
        self.clock += seconds
        self.probes.append((knobs_key(knobs), i, rep["status"], seconds))
        result = ProbeResult.model_validate(rep["result"])
        return result.model_copy(update={"wall_s": seconds})

    def charge(self, seconds: float) -> None:
        """Time spent before probing that the strategy must pay for (e.g. the memory trace)."""
        if self.clock + seconds > self.budget_s:
            raise OutOfBudget
        self.clock += seconds
        self.overhead_s += seconds

    def stable(self, result: ProbeResult) -> bool:
        return is_stable(
            result.status,
            result.peak_allocated,
            result.capacity or self.table.device_memory,
            self.table.headroom,
            result.alloc_retries,
        )

    def pick(self, knobs: Knobs | None) -> None:
        """The config this strategy would hand the user now."""
        key = knobs_key(knobs) if knobs is not None else None
        if not self.timeline or self.timeline[-1][1] != key:
            self.timeline.append((self.clock, key))

    # -- metrics -----------------------------------------------------------------------------------------------------
    def value_at(self, t: float) -> float:
        """Fraction of the table's best stable objective the pick at probe-second ``t`` reaches (0 if unstable)."""
        key = None
        for clock, k in self.timeline:
            if clock > t:
                break
            key = k
        if key is None:
            return 0.0
        return self.table.entries[key].value / self.table.best

    def seconds_to(self, fraction: float) -> float | None:
        for clock, key in self.timeline:
            if key is not None and self.table.entries[key].value >= fraction * self.table.best:
                return clock
        return None

    def final_pick(self) -> str | None:
        return self.timeline[-1][1] if self.timeline else None


class Tracker:
    """Best measured stable config so far, by the measured objective (the pick rule of grid/random/TPE)."""

    def __init__(self, env: Env) -> None:
        self.env = env
        self.best: tuple[float, Knobs] | None = None

    def see(self, knobs: Knobs, result: ProbeResult) -> float | None:
        value = self.env.table.objective.of(result, knobs.max_length) if self.env.stable(result) else None
        if value is not None and (self.best is None or value > self.best[0]):
            self.best = (value, knobs)
            self.env.pick(knobs)
        return value


def _recorded_space(raw: dict[str, Any]) -> Space:
    """The recorder's space, narrowed to the knob values the recorded rows hold (a resumed recording may have
    dropped some); strategies sample exactly the recorded grid."""
    rows = [r for r in raw["rows"] if r["repeats"]]
    choices = dict(raw["space"])
    for name, values in raw["space"].items():
        seen = {json.dumps(r["knobs"].get(name)) for r in rows}
        kept = [v for v in values if json.dumps(v) in seen]
        if kept:
            choices[name] = kept
    return Space.model_validate(choices)
