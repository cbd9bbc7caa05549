"""A search request and the study definition it writes: what a study searches, resumed as stored.

``SearchRequest.definition()`` is what `tuner search` stores on a new study (and what ``POST /studies`` writes);
re-running a study rebuilds the request from it, so every worker of a study searches the same space.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trials.contract import Knobs, ModelSpec
from tuner.errors import ConfigError
from tuner.job.objective import Objective
from tuner.job.space import Space, space_from_definition
from tuner.search.schedule import Schedule


@dataclass
class SearchRequest:
    study_name: str
    storage: str
    model: ModelSpec
    space: Space
    world_size: int
    global_batch: int
    objective: Objective
    budget_s: float
    device_memory: int | None = None
    headroom: float = 0.9
    n_trials: int | None = None
    baseline: Knobs | None = None
    baseline_source: dict[str, Any] | None = None  # what the user's baseline file said (for reports)
    schedule: Schedule = field(default_factory=Schedule)
    seed: int | None = None

    def definition(self) -> dict[str, Any]:
        return {
            "model": self.model.model_dump(mode="json"),
            "space": self.space.model_dump(mode="json"),
            "world_size": self.world_size,
            "global_batch": self.global_batch,
            "device_memory": self.device_memory,
            "headroom": self.headroom,
            "objective": self.objective.to_dict(),
            "budget_s": self.budget_s,
            "baseline": self.baseline.model_dump(mode="json") if self.baseline is not None else None,
            "baseline_source": self.baseline_source,
            "finalists": self.schedule.finalists,
        }


#: definition keys a resumed study must agree on: they decide which configs exist and what they measure
ESSENTIAL = ("model", "space", "world_size", "global_batch", "device_memory", "objective")


def check_resume(name: str, stored: dict[str, Any], wanted: dict[str, Any], explicit: set[str]) -> None:
    """A re-run of an existing study keeps its definition; an option the user set that contradicts it is an error."""
    for key in ESSENTIAL:
        if key in explicit and stored.get(key) != wanted.get(key):
            raise ConfigError(
                f"study {name!r} was created with a different {key} ({_short(stored.get(key))}); drop the option to "
                f"resume it, or pick a new --study name"
            )


def _short(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def request_from_definition(base: SearchRequest, stored: dict[str, Any]) -> SearchRequest:
    """The request to resume a study with: its stored definition, this run's budget, trials and seed."""
    return SearchRequest(
        study_name=base.study_name,
        storage=base.storage,
        model=ModelSpec.model_validate(stored["model"]),
        space=space_from_definition(stored["space"]),
        world_size=int(stored["world_size"]),
        global_batch=int(stored["global_batch"]),
        objective=Objective.from_dict(stored.get("objective")),
        budget_s=base.budget_s,
        device_memory=stored.get("device_memory"),
        headroom=float(stored.get("headroom") or base.headroom),
        n_trials=base.n_trials,
        baseline=Knobs.model_validate(stored["baseline"]) if stored.get("baseline") else None,
        baseline_source=stored.get("baseline_source"),
        schedule=base.schedule,
        seed=base.seed,
    )
