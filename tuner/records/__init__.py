"""The records floor: typed records every layer reads (storage converts to and from them once), below storage,
search, the API, the CLI and reporting. It imports only trials.contract."""

from tuner.records.candidate import Candidate
from tuner.records.probe import DEFAULT_HEADROOM, MEASURED, Fidelity, ProbeRow, ProbeStatus, is_stable

__all__ = ["DEFAULT_HEADROOM", "MEASURED", "Candidate", "Fidelity", "ProbeRow", "ProbeStatus", "is_stable"]
