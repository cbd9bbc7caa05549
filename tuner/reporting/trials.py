"""A study's trials as the user reads them: each Optuna trial joined with its tuner_probes rows, one typed record per
trial. `tuner trials` (tuner.cli.results) and ``GET /studies/{name}/trials`` (api.views) both list these records.

Pure: the callers load the Optuna trials and the probe rows (tuner.storage.schema.probes) and hand them in; nothing here
reads storage or imports optuna. It lives with the report because it is the read side of a finished or running study,
not a decision of the search (tuner.search) nor a storage concern (tuner.storage).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tuner.records import ProbeRow, ProbeStatus


class _State(Protocol):
    @property
    def name(self) -> str: ...


class TrialLike(Protocol):
    """What the join reads of an Optuna trial (optuna.trial.FrozenTrial has it)."""

    @property
    def number(self) -> int: ...

    @property
    def state(self) -> _State: ...

    @property
    def params(self) -> Mapping[str, Any]: ...

    @property
    def values(self) -> Sequence[float] | None: ...

    @property
    def user_attrs(self) -> Mapping[str, Any]: ...


@dataclass(frozen=True)
class TrialRecord:
    """One Optuna trial with its probe rows. The measurements are its latest probe row's (a confirmation re-probe
    attached to the trial counts); a trial without a row of its own (it reused another worker's probe, or its worker
    died mid-probe) shows what Optuna was told (its user attributes)."""

    number: int
    state: str  # Optuna's: COMPLETE, PRUNED, FAIL, RUNNING, WAITING
    params: dict[str, Any]
    value: float | None  # the objective Optuna recorded
    fidelity: str  # what the trial was proposed as: baseline, short ...
    status: ProbeStatus | None  # its latest probe's, else the one Optuna was told (skipped, interrupted); None: unknown
    cause: str | None  # see trial_cause
    objective: float | None
    samples_per_s: float | None
    peak_allocated: int | None
    stable: bool | None
    knobs: dict[str, Any]
    reused_from: int | None  # the trial whose measurement this one reused
    probe_seconds: float | None  # of its own latest probe
    probes: tuple[ProbeRow, ...] = ()  # its probe rows, oldest first

    @property
    def latest(self) -> ProbeRow | None:
        return self.probes[-1] if self.probes else None


def trial_cause(user_attrs: Mapping[str, Any], latest: ProbeRow | None) -> str | None:
    """Why a trial was pruned or failed. The probe row's measured cause is the truth when there is one (the runner's
    classification of what happened, e.g. "torch.OutOfMemoryError: ..."); else the cause Optuna was told (a trial
    that never got a row: "interrupted: worker ... died", "being probed by another worker"); else a failed probe's
    bare status ("oom", "timeout"). None for a trial with nothing to explain."""
    if latest is not None and latest.cause:
        return latest.cause
    told = user_attrs.get("cause")
    if told:
        return str(told)
    if latest is not None and latest.status != ProbeStatus.OK:
        return latest.status.value
    return None


def _told_status(attrs: Mapping[str, Any]) -> ProbeStatus | None:
    """The status Optuna was told of a trial without a probe row of its own (trials.contract.Status's value)."""
    told = attrs.get("status")
    return next((s for s in ProbeStatus if s.value == told), None)  # None: nothing told (or not a status)


def _measured(latest: ProbeRow | None, attrs: Mapping[str, Any], key: str) -> Any:
    return getattr(latest, key) if latest is not None else attrs.get(key)


def join_trials(trials: Iterable[TrialLike], rows: Iterable[ProbeRow]) -> list[TrialRecord]:
    """One record per trial, in the order given; ``rows`` attach to the trial of their ``trial_number`` (oldest
    first, by id). Rows of no given trial (confirm probes carry none) are left out: the caller lists them if it
    wants to."""
    by_trial: dict[int, list[ProbeRow]] = {}
    for row in sorted(rows, key=lambda r: r.id or 0):
        if row.trial_number is not None:
            by_trial.setdefault(row.trial_number, []).append(row)
    out: list[TrialRecord] = []
    for t in trials:
        probes = tuple(by_trial.get(t.number, ()))
        latest = probes[-1] if probes else None
        attrs = t.user_attrs
        reused = attrs.get("reused_from")
        out.append(
            TrialRecord(
                number=t.number,
                state=t.state.name,
                params=dict(t.params),
                value=t.values[0] if t.values else None,
                fidelity=str(attrs.get("fidelity") or (probes[0].fidelity.value if probes else "")),
                status=latest.status if latest else _told_status(attrs),
                cause=trial_cause(attrs, latest),
                objective=_measured(latest, attrs, "objective"),
                samples_per_s=_measured(latest, attrs, "samples_per_s"),
                peak_allocated=_measured(latest, attrs, "peak_allocated"),
                stable=_measured(latest, attrs, "stable"),
                knobs=dict((latest.knobs if latest else None) or attrs.get("knobs") or {}),
                reused_from=int(reused) if reused is not None else None,
                probe_seconds=latest.probe_seconds if latest else None,
                probes=probes,
            )
        )
    return out


__all__ = ["TrialLike", "TrialRecord", "join_trials", "trial_cause"]
