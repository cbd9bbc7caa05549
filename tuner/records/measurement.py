"""What a probe measured, as a typed record on its row (``ProbeRow.measurement``): per rank, its peaks and the peak of
each phase of the memory window (trials.contract.MEMORY_PHASES: the train step, then the eval forward and the eval
generate where the job evaluates: trials.contract.RankMemory.phases), the phase a failed probe failed in, and the
environment it ran in (fingerprint, versions).

Built once from the stored result JSON (trials.contract.ProbeResult as the probe wrote it). Rows stored before the
phases existed read with no phases (``phase_peaks`` empty: the faces show "-", never a value made up); rows stored by
a later version keep reading (unknown keys are ignored). A rank entry without its number is a corrupt row:
RecordError."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from trials.contract import MEMORY_PHASES, FailedAllocation, memory_need
from tuner.records.ruled_out import RecordError


def _count(value: Any) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else 0


def _maybe(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class RankPeaks:
    """One rank's memory, in bytes (trials.contract.RankMemory's fields the faces and the rules read)."""

    rank: int
    peak_allocated: int = 0
    peak_reserved: int = 0
    overhead: int = 0  # device used outside the caching allocator (CUDA context, NCCL ...); 0 on the emulated device
    device_used_peak: int | None = None
    oom_need: int | None = None  # emulated device, after an OOM: live bytes + the refused allocation
    capacity: int | None = None
    phases: dict[str, int] = field(default_factory=dict)  # MEMORY_PHASES -> peak allocated bytes; {} stored before
    # after an OOM: the allocation refused (op, shape, phase, bytes in use) and on CUDA the memory snapshot's path;
    # None for rows stored before them, or where the rank recorded none
    failed_allocation: FailedAllocation | None = None
    snapshot: str | None = None

    @property
    def need(self) -> int:
        """What this rank needed of its device (trials.contract.memory_need)."""
        return memory_need(self.peak_reserved, self.overhead, self.device_used_peak, self.peak_allocated)

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> RankPeaks:
        if not isinstance(stored, Mapping) or _maybe(stored.get("rank")) is None:
            raise RecordError(f"a probe result's rank entry has no rank number: {str(stored)[:80]}")
        phases = stored.get("phases")
        return cls(
            rank=int(stored["rank"]),
            peak_allocated=_count(stored.get("peak_allocated")),
            peak_reserved=_count(stored.get("peak_reserved")),
            overhead=_count(stored.get("overhead")),
            device_used_peak=_maybe(stored.get("device_used_peak")),
            oom_need=_maybe(stored.get("oom_need")) or None,
            capacity=_maybe(stored.get("capacity")),
            phases={p: _count(phases[p]) for p in MEMORY_PHASES if p in phases} if isinstance(phases, Mapping) else {},
            failed_allocation=_failed(stored.get("failed_allocation")),
            snapshot=str(stored["snapshot"]) if isinstance(stored.get("snapshot"), str) else None,
        )


def _failed(stored: Any) -> FailedAllocation | None:
    """The stored failed allocation (its known fields; a later version's extra keys ignored); None when absent or
    not readable as one (never a value made up)."""
    if not isinstance(stored, Mapping):
        return None
    try:
        return FailedAllocation.model_validate({k: v for k, v in stored.items() if k in FailedAllocation.model_fields})
    except ValidationError:
        return None


@dataclass(frozen=True)
class Measurement:
    """A probe's stored result, typed: its ranks (in rank order), the phase a failure named, its environment."""

    ranks: tuple[RankPeaks, ...] = ()
    phase: str | None = None  # where the rank whose failure names the probe's was (e.g. "generate")
    fingerprint: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)

    @property
    def memory_need(self) -> int | None:
        """The most any rank needed of its device (RankPeaks.need); None without ranks or with nothing measured."""
        needs = [r.need for r in self.ranks]
        return max(needs) if needs and max(needs) > 0 else None

    @property
    def oom_need(self) -> int:
        """After an OOM on the emulated device: the most bytes a rank was refused at (0: none recorded)."""
        return max((r.oom_need or 0 for r in self.ranks), default=0)

    @property
    def phase_peaks(self) -> dict[str, int]:
        """The peak allocated bytes of each measured phase, the most over the ranks, in MEMORY_PHASES order ({} for a
        row stored before the phases, or a probe whose window measured none)."""
        return phase_peaks(self.ranks)

    @property
    def ranks_differ(self) -> bool:
        """Whether the ranks' phase peaks differ (then a face shows them per rank, not only the most)."""
        return len({tuple(sorted(r.phases.items())) for r in self.ranks if r.phases}) > 1

    @classmethod
    def from_json(cls, stored: Mapping[str, Any] | None) -> Measurement:
        """From a row's stored result (None or a result without ranks: an empty measurement)."""
        if not isinstance(stored, Mapping):
            return cls()
        ranks = stored.get("ranks")
        entries = [RankPeaks.from_json(r) for r in ranks] if isinstance(ranks, list) else []
        phase = stored.get("phase")
        fingerprint = stored.get("fingerprint")
        versions = stored.get("versions")
        return cls(
            ranks=tuple(sorted(entries, key=lambda r: r.rank)),
            phase=str(phase) if phase else None,
            fingerprint=dict(fingerprint) if isinstance(fingerprint, Mapping) else {},
            versions={str(k): str(v) for k, v in versions.items()} if isinstance(versions, Mapping) else {},
        )


def phase_peaks(ranks: Iterable[RankPeaks]) -> dict[str, int]:
    """The most over ``ranks`` of each phase's peak, in MEMORY_PHASES order."""
    out: dict[str, int] = {}
    for r in ranks:
        for phase, peak in r.phases.items():
            out[phase] = max(out.get(phase, 0), peak)
    return {p: out[p] for p in MEMORY_PHASES if p in out}


__all__ = ["Measurement", "RankPeaks", "phase_peaks"]
