"""The records floor: typed records every layer reads (storage converts to and from them once), below storage,
search, the API, the CLI and reporting. It imports only trials.contract (whose Status is the one status enum) and
tuner.errors."""

from tuner.records.candidate import Candidate
from tuner.records.events import ProbeOutcome, ProposedProbe
from tuner.records.probe import (
    DEFAULT_HEADROOM,
    MEASURED,
    Fidelity,
    ProbeRow,
    ProbeStatus,
    baseline_row,
    failed_in_production,
    is_stable,
)
from tuner.records.run import STALE_AFTER_S, Claim, RecordError, RunStatus, SearchRun
from tuner.records.study import StudyDefinition, StudyRecord

__all__ = [
    "DEFAULT_HEADROOM",
    "MEASURED",
    "STALE_AFTER_S",
    "Candidate",
    "Claim",
    "Fidelity",
    "ProbeOutcome",
    "ProbeRow",
    "ProbeStatus",
    "ProposedProbe",
    "RecordError",
    "RunStatus",
    "SearchRun",
    "StudyDefinition",
    "StudyRecord",
    "baseline_row",
    "failed_in_production",
    "is_stable",
]
