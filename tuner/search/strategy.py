"""The search's phases on an Optuna study: what to probe next, and what a result means. It runs nothing itself.

``propose(seconds_left)`` returns the next probe (or None when done) and ``observe(proposal, result)`` records what
came back; tuner.session.driver drives it with the real runner and the database, benchmarks/replay.py with a table.

1. baseline: the user's current config (``--baseline``) is probed first, as trial 0.
2. explore: the proposer pipeline (tuner.search.pipeline) names configs until the guide expects no gain, the space is
   exhausted or the budget must go to the confirm phase. Duplicates reuse the earlier measurement; configs the evidence
   (tuner.search.evidence: the frontier, the memory estimate) says must OOM are told to Optuna as PRUNED "inferred-oom"
   trials without running.
3. confirm: the finalists (tuner.search.confirm) are re-probed with more measured steps; selection ranks them on a
   lower bound of their throughput given every probe's evidence (tuner.search.selection).

The time model (tuner.search.schedule.TimeModel) keeps every probe in the budget; Optuna is reached only through the
adapter tuner.search.study.SearchStudy (OOMs PRUNED with a positive constraint, so TPE learns the infeasible region).
"""

from __future__ import annotations

from collections.abc import Callable

import optuna
from optuna.trial import TrialState

from trials.contract import Knobs, ProbeResult
from tuner.memory.frontier import Frontier
from tuner.records import Candidate, Fidelity, ProbeRow
from tuner.search.confirm import Finalists
from tuner.search.evidence import EstimatorLike, Evidence
from tuner.search.observation import inferred_row
from tuner.search.pipeline import Pipeline
from tuner.search.schedule import TimeModel
from tuner.search.setup import Outcome, Proposal, SearchSetup
from tuner.search.study import SearchStudy

__all__ = ["Outcome", "Proposal", "SearchSetup", "Strategy"]


class Strategy:
    """One search's decisions over its Optuna study: the evidence, the proposer pipeline, the confirm phase, the time
    model. ``worker`` is tagged on every trial asked, so a resume can fail the trials of a dead worker."""

    def __init__(
        self,
        study: optuna.Study,
        setup: SearchSetup,
        *,
        estimator: EstimatorLike | None = None,
        frontier: Frontier | None = None,
        worker: str | None = None,
    ) -> None:
        self.study, self.setup, self.schedule = study, setup, setup.schedule
        self.evidence = Evidence(
            frontier=frontier if frontier is not None else Frontier(),
            estimator=estimator,
            device_memory=setup.device_memory,
            estimate_margin=setup.schedule.estimate_margin,
        )
        self.time = TimeModel(setup.schedule, self.evidence)
        self.pipeline = Pipeline.of(setup)
        self.trials = SearchStudy(study, worker, setup.headroom, setup.space, self.pipeline.context.key)
        self.events: list[ProbeRow] = []  # inferred rows the driver should store
        self.explored = self.inferred = 0
        self.baseline_deferred = False  # another live worker is probing the baseline (tuner.session.driver)
        self.finalists = Finalists(setup.schedule)  # the confirm phase

    # -- state -------------------------------------------------------------------------------------------------------
    @property
    def rows(self) -> list[ProbeRow]:
        return self.evidence.rows

    @property
    def frontier(self) -> Frontier:
        return self.evidence.frontier

    @property
    def exhausted(self) -> bool:  # nothing left to explore: the space is exhausted, or the guide converged
        return self.pipeline.stopped is not None

    @property
    def converged(self) -> bool:  # the guide expects no unprobed config to gain Schedule.min_expected_gain
        return self.pipeline.stopped == "converged"

    @property
    def estimator(self) -> EstimatorLike | None:
        return self.evidence.estimator

    @estimator.setter
    def estimator(self, estimator: EstimatorLike | None) -> None:
        self.evidence.estimator = estimator

    def load_rows(self, rows: list[ProbeRow]) -> None:
        """Replaces the known probe rows (e.g. with the database's, including other workers')."""
        self.evidence.load(rows)

    def use_frontier(self, frontier: Frontier) -> None:
        """Swaps in another frontier (e.g. one ordering ZeRO stages) and feeds it every measurement so far."""
        self.evidence.use_frontier(frontier)

    def drain(self) -> list[ProbeRow]:
        out, self.events = self.events, []
        return out

    def best(self) -> Candidate | None:
        return self.evidence.best()

    # -- proposing ---------------------------------------------------------------------------------------------------
    def propose(self, seconds_left: float | None = None) -> Proposal | None:
        """The next probe to run, or None when the search is done (budget, trials or space exhausted)."""
        baseline = self.setup.baseline
        had = self.baseline_deferred or self.evidence.has_fidelity(Fidelity.BASELINE)  # or another worker probes it
        if baseline is not None and not had and self.time.fits(Fidelity.SHORT, seconds_left):
            trial = self.trials.ask()
            trial.set_user_attr("fidelity", Fidelity.BASELINE.value)
            return self._proposal(baseline, Fidelity.BASELINE, seconds_left, trial)
        if not self._explore_done(seconds_left):
            proposal = self._explore(seconds_left)
            if proposal is not None:
                return proposal
        return self._confirm(seconds_left)

    def _explore_done(self, seconds_left: float | None) -> bool:
        if self.exhausted or (self.setup.n_trials is not None and self.explored >= self.setup.n_trials):
            return True
        waiting = self.finalists.pending(self.rows)  # time is kept for their confirm probes
        return seconds_left is not None and not self.time.short_fits_beside(waiting, seconds_left)

    def _explore(self, seconds_left: float | None) -> Proposal | None:
        """The first of the pipeline's tries to probe; the others (measured, claimed, ruled out) are told on the way."""
        for pick in self.pipeline.picks(self.evidence, self._record_inferred):
            trial, knobs, key = self.trials.ask_short(pick)  # pick None: the sampler (TPE) picks
            earlier = self.evidence.measured(key)
            if earlier is not None:
                self.trials.tell_reused(trial, earlier)
            elif key in self.evidence.skipped:
                self.trials.skip(trial)
            elif (short := self._short(knobs, seconds_left, trial, key)) is not None:
                return short
        return None

    def _record_inferred(self, knobs: Knobs) -> None:
        """A config a proposer ruled out (the OOM boundary): on record as an inferred-oom trial, never run."""
        trial, knobs, key = self.trials.ask_short(knobs)
        if self._short(knobs, None, trial, key) is not None:  # cannot happen: the proposer read the same
            self.trials.skip(trial, "not ruled out after all")  # evidence; never leave a trial running

    def _short(self, knobs: Knobs, seconds_left: float | None, trial: optuna.trial.Trial, key: str) -> Proposal | None:
        """The short probe of ``knobs``, or None when the evidence says it must OOM: its trial is told inferred-oom."""
        proposal = self._proposal(knobs, Fidelity.SHORT, seconds_left, trial, key)
        inference = self.evidence.infer(knobs)
        if inference.verdict != "oom":
            proposal.estimate_bytes = inference.estimate
            return proposal
        row = inferred_row(trial.number, proposal.config, key, inference, self.setup.device_memory)
        self.trials.tell(trial, row)
        self.evidence.add(row)  # an inferred row: the evidence keeps it, the frontier learns nothing from it
        self.events.append(row)
        self.inferred += 1
        return None

    def _proposal(
        self, knobs: Knobs, fidelity: Fidelity, left: float | None, trial: optuna.trial.Trial | None, key: str = ""
    ) -> Proposal:
        config = self.setup.probe_config(knobs, fidelity, self.time.timeout(fidelity, left, knobs))
        expected = self.time.expected(Fidelity.CONFIRM if fidelity == Fidelity.CONFIRM else Fidelity.SHORT)
        return Proposal(config, fidelity, key or self.pipeline.context.key(knobs), trial, expected)

    def _confirm(self, seconds_left: float | None) -> Proposal | None:
        cand = self.finalists.claim_next(self.rows) if self.time.fits(Fidelity.CONFIRM, seconds_left) else None
        if cand is None:
            return None
        return self._proposal(Knobs.model_validate(cand.knobs), Fidelity.CONFIRM, seconds_left, None, cand.config_key)

    # -- observing ---------------------------------------------------------------------------------------------------
    def observe(
        self, proposal: Proposal, result: ProbeResult, record: Callable[[ProbeRow], None] | None = None
    ) -> Outcome:
        """Records a probe's result: the trial is told COMPLETE, PRUNED (OOM) or FAIL (error/timeout). ``record``
        (the driver's store) gets the row first: a measurement is kept before Optuna hears of it."""
        row = self.setup.row_for(proposal, result)
        if record is not None:
            record(row)
        self.evidence.add(row)
        if proposal.fidelity == Fidelity.SHORT:
            self.explored += 1
        state = self.trials.tell(proposal.trial, row) if proposal.trial is not None else None
        return Outcome(row=row, state=state, objective=row.objective, stable=row.stable)

    def observe_row(self, proposal: Proposal, row: ProbeRow) -> TrialState | None:
        """Another worker measured this config first: reuse its row instead of probing."""
        return self.trials.tell_reused(proposal.trial, row) if proposal.trial is not None else None

    def abandon(self, proposal: Proposal, cause: str) -> None:
        """The proposal will not be probed (e.g. another worker is probing it right now)."""
        self.evidence.skipped.add(proposal.config_key)
        if proposal.trial is not None:
            self.trials.skip(proposal.trial, cause)
