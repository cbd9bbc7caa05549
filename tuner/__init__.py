"""tuner: finds the fastest training configuration that will not run out of memory.

The Python API (tuner.python_api; imported on first use, so ``import tuner`` stays light):

- ``tuner.tune(budget="30m", model=..., baseline="training_args.json", ...)`` runs a search (`tuner search`);
- ``tuner.best_config(study, storage=None, format="json")`` is a study's best stable config (`tuner best`);
- ``tuner.estimate(model, knobs, world_size=1)`` predicts one config's peak memory per rank (`tuner estimate`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["__version__", "best_config", "estimate", "tune"]

if TYPE_CHECKING:
    from tuner.python_api import best_config, estimate, tune


def __getattr__(name: str) -> Any:
    if name in ("tune", "best_config", "estimate"):
        from tuner import python_api

        return getattr(python_api, name)
    raise AttributeError(f"module 'tuner' has no attribute {name!r}")
