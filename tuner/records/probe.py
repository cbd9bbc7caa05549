"""The probe row: one typed record per probe that ran (or was ruled out without running), as tuner_probes stores it
and as selection, the frontier, the guide and the time model read it. Statuses and fidelities are enums, as optuna's
``FrozenTrial`` has ``TrialState`` (the status is trials.contract.Status, the project's one status enum). The builders
of a row from a probe's result are tuner.search.observation's; tuner.search.study tells Optuna what a row means."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from functools import cached_property
from typing import Any

from trials.contract import Status
from tuner.records.measurement import Measurement
from tuner.records.production import ProductionResult
from tuner.records.ruled_out import RecordError, RuledOutBy

#: How a probe ended, or that it was ruled out without running: the project's one status enum (trials.contract.Status,
#: with its exit codes, severity, transience and listing order), under the name the probe rows have always used.
ProbeStatus = Status


class Fidelity(str, Enum):
    """How long a probe ran: the user's baseline, a short explore probe, a longer confirm probe; or inferred (none);
    or the user's own training run of a config, recorded back (production)."""

    BASELINE = "baseline"
    SHORT = "short"
    CONFIRM = "confirm"
    INFERRED = "inferred"
    PRODUCTION = "production"  # the user's real training run (tuner.integrations.transformers.TunerCallback)

    def __str__(self) -> str:
        return self.value

    @property
    def measured(self) -> bool:
        """A probe that ran (a production run is not a probe: the search's evidence and time model leave it out)."""
        return self in (Fidelity.BASELINE, Fidelity.SHORT, Fidelity.CONFIRM)


MEASURED = frozenset({Fidelity.BASELINE, Fidelity.SHORT, Fidelity.CONFIRM})


@dataclass(frozen=True)
class ProbeRow:
    config_key: str  # hash of the knobs + world size + accumulation (tuner.job.space.config_key)
    fidelity: Fidelity
    status: ProbeStatus
    knobs: dict[str, Any]  # trials.contract.Knobs as JSON
    config: dict[str, Any]  # the whole ProbeConfig sent, as JSON
    trial_number: int | None = None  # the Optuna trial this probe belongs to (None: a confirm probe)
    cause: str | None = None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    objective: float | None = None  # what the search maximises (retained tokens/s or samples/s)
    peak_allocated: int | None = None  # max over ranks
    peak_reserved: int | None = None
    capacity: int | None = None
    alloc_retries: int | None = None
    stable: bool = False
    estimate_bytes: int | None = None  # the memory estimate made before probing
    probe_seconds: float | None = None  # wall clock of the probe
    setup_s: float | None = None  # the probe's fixed cost: launch to first step
    result: dict[str, Any] | None = None  # the whole ProbeResult, as JSON
    ruled_out_by: RuledOutBy | None = None  # an inferred row's reason, as data (stored in the result column)
    # set by the storage
    id: int | None = None
    study_name: str | None = None
    run_id: int | None = None
    created_at: dt.datetime | None = None

    def __post_init__(self) -> None:
        """The invariants of a row, checked when it is built (as optuna's FrozenTrial._validate): a row ruled out
        without running is inferred-oom, has no result and says by what (``ruled_out_by``); a measured row that
        ran ok has its result and its peak. RecordError names the row and what is off."""
        inferred = self.fidelity is Fidelity.INFERRED
        if inferred != (self.status is ProbeStatus.INFERRED_OOM) or inferred != (self.ruled_out_by is not None):
            raise RecordError(
                f"probe row {self.config_key} ({self.fidelity}, {self.status}): an inferred row, and only one, is "
                "inferred-oom and says what ruled it out (ruled_out_by)"
            )
        if inferred and self.result is not None:
            raise RecordError(f"probe row {self.config_key}: an inferred row ran nothing, it has no result")
        if (
            self.fidelity.measured
            and self.status is ProbeStatus.OK
            and (self.result is None or self.peak_allocated is None)
        ):
            raise RecordError(f"probe row {self.config_key}: a measured ok row has its result and its peak")

    @property
    def measured(self) -> bool:
        return self.fidelity.measured

    @property
    def memory_need(self) -> int | None:
        """What the probe needed of the device (trials.contract.memory_need, the max over ranks, from the stored
        result): the quantity the stability rule and the memory estimate's calibration use. Rows without per-rank
        parts (older ones) fall back to the reserved, then the allocated peak."""
        need = self.measurement.memory_need
        return need if need is not None else (self.peak_reserved or self.peak_allocated)

    @cached_property
    def measurement(self) -> Measurement:
        """The stored result, typed (per rank: peaks and per-phase peaks): built once per row. Empty for an inferred
        row (it ran nothing) and for a production row (its result is ``production``'s)."""
        if self.fidelity is Fidelity.INFERRED or self.fidelity is Fidelity.PRODUCTION:
            return Measurement()
        return Measurement.from_json(self.result)

    @property
    def production(self) -> ProductionResult | None:
        """What the user's real run recorded, for a production row (None for any other)."""
        if self.fidelity is not Fidelity.PRODUCTION:
            return None
        return ProductionResult.from_json(self.result or {})

    def to_record(self) -> dict[str, Any]:
        """The columns to store (enums as their values; the storage's own id and timestamp left to it)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in _STORAGE_SET}
        out["fidelity"], out["status"] = self.fidelity.value, self.status.value
        ruled = out.pop("ruled_out_by")
        if ruled is not None:  # an inferred row's result column holds what ruled it out
            out["result"] = {"ruled_out_by": ruled.to_json()}
        return out

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> ProbeRow:
        """A row from stored columns (unknown columns ignored, missing ones None)."""
        values: dict[str, Any] = {name: record.get(name) for name in _FIELDS}
        values["fidelity"] = Fidelity(record["fidelity"])
        values["status"] = ProbeStatus(record["status"])
        values["stable"] = bool(record.get("stable"))
        values["knobs"] = dict(record["knobs"])
        values["config"] = dict(record.get("config") or {})
        if values["fidelity"] is Fidelity.INFERRED:
            stored = (values.pop("result") or {}).get("ruled_out_by")
            values["ruled_out_by"] = (
                RuledOutBy.from_json(stored)
                if stored is not None
                else RuledOutBy.from_cause(values["cause"], values["estimate_bytes"])  # stored before it existed
            )
        return cls(**values)


_FIELDS = tuple(f.name for f in dataclasses.fields(ProbeRow) if f.name != "ruled_out_by")
_STORAGE_SET = ("id", "created_at")


DEFAULT_HEADROOM = 0.9  # stable = memory need at most this fraction of the device's memory (`--headroom`)


def is_stable(status: str, need: int | None, capacity: int | None, headroom: float, alloc_retries: int | None) -> bool:
    """Finished, memory need at most ``headroom`` x capacity, and no allocator retries (a sign of fragmentation).

    ``need`` is trials.contract.memory_need: max(peak reserved + the memory outside the caching allocator (CUDA
    context, NCCL buffers, other processes), the device-level use sampled in the window); on the emulated CPU device
    it is the peak of live tensors."""
    if status != ProbeStatus.OK or need is None:
        return False
    if capacity is not None and need > headroom * capacity:
        return False
    return not alloc_retries


# -- rules over a study's rows that every reader shares ------------------------------------------------------------
def failed_in_production(rows: Iterable[ProbeRow]) -> set[str]:
    """Config keys whose real training run (a production row) ran out of memory or failed: never served again."""
    return {r.config_key for r in rows if r.fidelity == Fidelity.PRODUCTION and r.status != ProbeStatus.OK}


def baseline_row(rows: Iterable[ProbeRow]) -> ProbeRow | None:
    """The row that stands for the user's own config (trial 0, ``--baseline``) beside the pick: the speed-up of the
    search's summary, `tuner best --changes`, ``GET /best-config`` and the report all read this one.

    The first stored one (rows come in storage order). A study holds one baseline row unless its baseline was probed
    twice: a worker took over the claim of one presumed dead whose row was still in its journal (that row arrives
    later, replayed by tuner.session.recovery). The first stored
    is the row the search acted on: the strategy stops proposing the baseline once one exists, and the evidence
    reads the first measured row of a config (tuner.search.evidence.Evidence.measured); a later one is a duplicate
    nothing decided on. It also never changes once given, so the summary a worker printed, the API and the report
    keep naming the same row however many workers or resumes follow."""
    return next((r for r in rows if r.fidelity == Fidelity.BASELINE), None)


#: what the runner adds to the refusal of a config whose engine an earlier probe of the study found refused (it is
#: not launched again): tuner.probing.runner writes it, the faces read the refusal without it (``refusal_reason``)
EARLIER_REFUSAL = " (said by an earlier probe; not launched)"


def refusal_reason(cause: str | None) -> str:
    """A refused probe's reason, one line, the same for every probe its engine's refusal stopped."""
    return " ".join((cause or "").split()).removesuffix(EARLIER_REFUSAL)


__all__ = [
    "DEFAULT_HEADROOM",
    "EARLIER_REFUSAL",
    "MEASURED",
    "Fidelity",
    "ProbeRow",
    "ProbeStatus",
    "baseline_row",
    "failed_in_production",
    "is_stable",
    "refusal_reason",
]
