"""What the user's real training run recorded (tuner.integrations.transformers.TunerCallback): the part of a
production row's result that is not a probe's (which rank, on which device, how many steps, where it failed, what
memory was read). Built from the stored JSON once (``ProbeRow.production``); the faces read these fields."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class ProductionResult:
    rank: int = 0  # the rank that recorded (each rank of a run records its own row)
    device: str | None = None  # e.g. "cuda:0", "cpu"
    steps: int = 0  # training steps seen
    step_s: float | None = None  # median step time, the first (setup) step left out
    phase: str | None = None  # where a failed run was (train, eval ...); None when it finished
    memory: str = "peak"  # what the peak is: "cuda max_memory_allocated", "host peak RSS above train begin"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> ProductionResult:
        """From a production row's stored result (keys it lacks take their defaults; others are ignored)."""
        step_s = stored.get("step_s")
        return cls(
            rank=int(stored.get("rank") or 0),
            device=str(stored["device"]) if stored.get("device") is not None else None,
            steps=int(stored.get("steps") or 0),
            step_s=float(step_s) if step_s is not None else None,
            phase=str(stored["phase"]) if stored.get("phase") else None,
            memory=str(stored.get("memory") or "peak"),
        )


__all__ = ["ProductionResult"]
