"""What a search's listener is told, as the listener reads it: a probe about to run (``ProposedProbe``) and what came
of it (``ProbeOutcome``). The strategy's own Proposal and Outcome (tuner.search.setup) carry more (the live Optuna
trial, the state it was told); a display (tuner.cli.progress) depends only on these read-only views."""

from __future__ import annotations

from typing import Protocol

from trials.contract import ProbeConfig
from tuner.records.probe import Fidelity, ProbeRow


class ProposedProbe(Protocol):
    @property
    def config(self) -> ProbeConfig: ...

    @property
    def fidelity(self) -> Fidelity: ...

    @property
    def config_key(self) -> str: ...

    @property
    def trial_number(self) -> int | None: ...

    @property
    def expected_s(self) -> float: ...


class ProbeOutcome(Protocol):
    @property
    def row(self) -> ProbeRow: ...  # the probe's row as the strategy built it


__all__ = ["ProbeOutcome", "ProposedProbe"]
