"""Why a config was ruled out without running (an inferred-oom row), as data: the measured config whose memory it
needs at least (the feasibility frontier: tuner.memory.frontier), or the memory estimate far over the device. The
row's cause says it in words for a person; displays group and cite by this record (tuner.cli.progress)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tuner.errors import TunerError

#: how the cause of an inferred row begins, by what ruled it out (tuner.memory.frontier.Frontier.explain,
#: tuner.search.evidence.Evidence.infer): only rows stored before ruled_out_by existed are read back from it
_MEASURED = "inferred-oom from measured "
_ESTIMATED = "inferred-oom: estimated peak"


class RecordError(TunerError, ValueError):
    """A record that breaks its invariants (a corrupt or foreign row, or a bug building one): names what is wrong;
    one line and exit 2 on the command line, as every TunerError."""


@dataclass(frozen=True)
class RuledOutBy:
    """Exactly one of: ``measured`` (the knobs of the measured config that ran out of memory, or over the headroom,
    and needs no more memory than this one), ``estimate_bytes`` (the calibrated estimate, above ``margin`` x the
    device), or ``stated`` (the cause text of a row stored before this record existed, when it names neither)."""

    measured: dict[str, Any] | None = None
    estimate_bytes: int | None = None
    margin: float | None = None
    stated: str | None = field(default=None)

    def __post_init__(self) -> None:
        given = [x is not None for x in (self.measured, self.estimate_bytes, self.stated)]
        if sum(given) != 1:
            raise RecordError(f"ruled_out_by needs exactly one of measured, estimate_bytes, stated: {self}")

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if v is not None}

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> RuledOutBy:
        measured = stored.get("measured")
        return cls(
            measured=dict(measured) if measured is not None else None,
            estimate_bytes=stored.get("estimate_bytes"),
            margin=stored.get("margin"),
            stated=stored.get("stated"),
        )

    @classmethod
    def from_cause(cls, cause: str | None, estimate_bytes: int | None) -> RuledOutBy:
        """The record of a row stored before ruled_out_by existed, read once from its cause (the storage's
        conversion): the measured config's label ("micro=8 len=128 zero_stage=3", values as text), the estimate, or
        the text as it stands."""
        text = cause or "inferred-oom"
        if text.startswith(_MEASURED):
            names = {"micro": "micro_batch_size", "len": "max_length"}
            pairs = (part.partition("=") for part in text[len(_MEASURED) :].split() if "=" in part)
            return cls(measured={names.get(name, name): value for name, _, value in pairs})
        if text.startswith(_ESTIMATED) and estimate_bytes is not None:
            return cls(estimate_bytes=estimate_bytes)
        return cls(stated=text)


__all__ = ["RecordError", "RuledOutBy"]
