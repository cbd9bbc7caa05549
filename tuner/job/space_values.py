"""The values a space file writes for one knob: a list, a single value, or an integer range (``IntRange``:
``{low: 1, high: 64, scale: pow2}``, or ``scale: linear`` with ``step``), and the 2e8 / "5e8" spellings of bucket
sizes (tuner.job.space reads them)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

MAX_CHOICES = 64


class IntRange(BaseModel):
    model_config = ConfigDict(extra="forbid")
    low: int = Field(ge=1)
    high: int = Field(ge=1)
    scale: Literal["pow2", "linear"] = "pow2"
    step: int = Field(1, ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> IntRange:
        if self.low > self.high:
            raise ValueError(f"range low {self.low} is above high {self.high}")
        return self

    def count(self) -> int:
        """How many values the range holds, without listing them."""
        if self.scale == "linear":
            return (self.high - self.low) // self.step + 1
        return max(0, self.high.bit_length() - (self.low - 1).bit_length())

    def values(self) -> list[int]:
        n = self.count()
        if n > MAX_CHOICES:
            raise PydanticCustomError(
                "too_many",
                "the range {low}..{high} holds {n} values; at most {most} per knob",
                {**self._ends(), "n": n},
            )
        if self.scale == "linear":
            return list(range(self.low, self.high + 1, self.step))
        out, v = [], 1
        while v <= self.high:
            if v >= self.low:
                out.append(v)
            v *= 2
        if not out:
            raise ValueError(f"no power of two lies in [{self.low}, {self.high}]")
        return out

    def _ends(self) -> dict[str, int]:
        return {"low": self.low, "high": self.high, "most": MAX_CHOICES}


def as_list(value: Any) -> Any:
    if isinstance(value, dict):
        return IntRange.model_validate(value).values()
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def to_int(value: Any) -> Any:
    """Accepts 2e8 / "5e8" spellings for bucket sizes (YAML reads 5e8 as a string)."""
    if isinstance(value, str):
        try:
            as_float = float(value)
        except ValueError:
            return value
        return int(as_float) if as_float.is_integer() else value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


__all__ = ["MAX_CHOICES", "IntRange", "as_list", "to_int"]
