"""The search's phases on an Optuna study: what to probe next, and what a result means. It runs nothing itself.

``propose(seconds_left)`` returns the next probe (or None when done) and ``observe(proposal, result)`` records what
came back. tuner.search.driver drives it with the real runner and the database; benchmarks/replay.py with a table
lookup and a simulated clock. The phases:

1. baseline: the user's current config (``--baseline``) is probed first, as trial 0.
2. explore: the proposers (tuner.search.proposers: the opening bisection, the guide, TPE, a random unknown config when
   stuck) name configs until the guide expects no gain, the space is exhausted or the budget must go to the confirm
   phase. Duplicates reuse the earlier measurement; configs the evidence (tuner.search.evidence: the frontier, the
   memory estimate) says must OOM are recorded as PRUNED trials with cause "inferred-oom" without running. OOM probes
   are PRUNED with a positive constraint (``trial.set_constraint``) so TPE, where it proposes, learns the infeasible
   region.
3. confirm: the finalists (tuner.search.confirm) are re-probed with more measured steps; selection ranks them on a
   lower bound of their throughput given every probe's evidence (tuner.search.selection).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import TrialState, create_trial

from trials.contract import JobSettings, Knobs, ModelSpec, ProbeConfig, ProbeResult
from tuner.job.batching import accumulation_steps
from tuner.job.objective import Objective
from tuner.job.space import Space, config_key
from tuner.memory.frontier import Frontier
from tuner.probing.config import probe_config
from tuner.records import DEFAULT_HEADROOM, Candidate, Fidelity, ProbeRow
from tuner.search import confirm, proposers
from tuner.search.evidence import EstimatorLike, Evidence
from tuner.search.observation import inferred_row, probe_row
from tuner.search.sampling import fixed_params
from tuner.search.schedule import Schedule, budgeted_seconds, expected_seconds, timeout_for
from tuner.search.selection import candidates
from tuner.search.study import tell, tell_skipped

if TYPE_CHECKING:
    from tuner.search.request import SearchRequest


@dataclass(frozen=True)
class SearchSetup:
    """What one search works on: the space, the fixed job parameters, the memory limits and the probe schedule."""

    space: Space
    model: ModelSpec
    world_size: int
    global_batch: int
    objective: Objective
    device_memory: int | None = None
    headroom: float = DEFAULT_HEADROOM
    schedule: Schedule = field(default_factory=Schedule)
    baseline: Knobs | None = None
    n_trials: int | None = None  # explore probes the search may run (inferred configs and duplicates are free)
    seed: int | None = None
    job: JobSettings = field(default_factory=JobSettings)  # label/generation lengths and beams of the user's job
    deepspeed_base: Mapping[str, Any] | None = None  # the user's DeepSpeed JSON, "auto" resolved: every probe's base
    training_args: Mapping[str, Any] | None = None  # the user's training args (the Trainer's optimizer values)

    @classmethod
    def of(cls, request: SearchRequest) -> SearchSetup:
        return cls(
            space=request.space,
            model=request.model,
            world_size=request.world_size,
            global_batch=request.global_batch,
            objective=request.objective,
            device_memory=request.device_memory,
            headroom=request.headroom,
            schedule=request.schedule,
            baseline=request.baseline,
            n_trials=request.n_trials,
            seed=request.seed,
            job=request.job.settings() if request.job is not None else JobSettings(),
            deepspeed_base=request.baseline_source,
            training_args=(request.baseline_files or {}).get("training_args"),
        )


@dataclass
class Proposal:
    config: ProbeConfig
    fidelity: Fidelity
    config_key: str
    trial: optuna.trial.Trial | None
    expected_s: float
    estimate_bytes: int | None = None

    @property
    def trial_number(self) -> int | None:
        return self.trial.number if self.trial is not None else None


@dataclass
class Outcome:
    row: ProbeRow  # without run_id/study_name: the driver stores it
    state: TrialState | None  # what the Optuna trial was told (None for confirm probes)
    objective: float | None
    stable: bool


class Strategy:
    """One search's decisions over its Optuna study: the evidence, the proposers, the confirm phase, the time model."""

    def __init__(
        self,
        study: optuna.Study,
        setup: SearchSetup,
        *,
        estimator: EstimatorLike | None = None,
        frontier: Frontier | None = None,
        worker: str | None = None,  # tagged on every trial asked, so a resume can fail the trials of a dead worker
    ) -> None:
        self.study = study
        self.setup = setup
        self.schedule = setup.schedule
        self.worker = worker
        self.evidence = Evidence(
            frontier=frontier or Frontier(),
            estimator=estimator,
            device_memory=setup.device_memory,
            estimate_margin=setup.schedule.estimate_margin,
        )
        self.context = proposers.Context(
            space=setup.space,
            world_size=setup.world_size,
            global_batch=setup.global_batch,
            headroom=setup.headroom,
            device_memory=setup.device_memory,
            schedule=setup.schedule,
            rng=random.Random(setup.seed),
        )
        self.events: list[ProbeRow] = []  # inferred rows the driver should store
        self.explored = 0
        self.inferred = 0
        self.reused = 0
        self.exhausted = False  # nothing left to explore (space exhausted, or converged)
        self.converged = False  # the guide expects no unprobed config to beat the best (Schedule.min_expected_gain)
        self._opened = False  # the opening proposer is done
        self._walled = False  # the memory-wall proposer is done (tuner.search.memory_wall)
        self.baseline_deferred = False  # another live worker is probing the baseline (tuner.search.driver)
        self._claimed_confirm: set[str] = set()

    # -- state -------------------------------------------------------------------------------------------------------
    @property
    def rows(self) -> list[ProbeRow]:
        return self.evidence.rows

    @property
    def estimator(self) -> EstimatorLike | None:
        return self.evidence.estimator

    @estimator.setter
    def estimator(self, estimator: EstimatorLike | None) -> None:
        self.evidence.estimator = estimator

    @property
    def frontier(self) -> Frontier:
        return self.evidence.frontier

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

    # -- time model (tuner.search.schedule) -----------------------------------------------------------------------
    def expected_seconds(self, fidelity: Fidelity) -> float:
        return expected_seconds(self.rows, self.schedule, fidelity)

    def timeout_for(self, fidelity: Fidelity, seconds_left: float | None, knobs: Knobs | None = None) -> float:
        return timeout_for(self.rows, self.schedule, fidelity, seconds_left, knobs)

    def _fits_in(self, fidelity: Fidelity, seconds_left: float | None) -> bool:
        if seconds_left is None:
            return True
        return budgeted_seconds(self.rows, self.schedule, fidelity, seconds_left) <= seconds_left

    # -- proposing ---------------------------------------------------------------------------------------------------
    def propose(self, seconds_left: float | None = None) -> Proposal | None:
        """The next probe to run, or None when the search is done (budget, trials or space exhausted)."""
        if self._baseline_pending() and self._fits_in(Fidelity.SHORT, seconds_left):
            return self._ask_baseline(seconds_left)
        if not self._explore_done(seconds_left):
            proposal = self._explore(seconds_left)
            if proposal is not None:
                return proposal
        return self._confirm(seconds_left)

    def _probe_config(self, knobs: Knobs, fidelity: Fidelity, seconds_left: float | None) -> ProbeConfig:
        s = self.setup
        accum = accumulation_steps(s.global_batch, knobs.micro_batch_size, s.world_size)
        if accum is None:  # the space is restricted to reachable micro batches; a baseline may not be
            raise ValueError(f"micro batch {knobs.micro_batch_size} cannot reach global batch {s.global_batch}")
        warmup, measure = self.schedule.confirm if fidelity == Fidelity.CONFIRM else self.schedule.short
        return probe_config(
            knobs=knobs,
            baseline=s.deepspeed_base,
            training_args=s.training_args,
            model=s.model,
            world_size=s.world_size,
            gradient_accumulation_steps=accum,
            warmup_steps=warmup,
            measure_steps=measure,
            device_memory=s.device_memory,
            timeout_s=self.timeout_for(fidelity, seconds_left, knobs),
            seed=s.seed or 0,
            job=s.job,
        )

    def _baseline_pending(self) -> bool:
        return (
            self.setup.baseline is not None
            and not self.baseline_deferred
            and not self.evidence.has_fidelity(Fidelity.BASELINE)
        )

    def _explore_done(self, seconds_left: float | None) -> bool:
        if self.exhausted or (self.setup.n_trials is not None and self.explored >= self.setup.n_trials):
            return True
        if seconds_left is None:
            return False
        # keep time for the finalists' confirm probes, but only for as many as can still fit: when not even one
        # confirm fits, the time left goes to short probes instead of being kept for nothing
        waiting = confirm.pending(candidates(self.rows), self.schedule)
        confirm_s = self.expected_seconds(Fidelity.CONFIRM)
        reserve = min(waiting, int(seconds_left // confirm_s)) * confirm_s if confirm_s > 0 else 0.0
        return seconds_left - reserve < budgeted_seconds(self.rows, self.schedule, Fidelity.SHORT, seconds_left)

    def _ask(self, fixed: dict[str, Any] | None = None) -> optuna.trial.Trial:
        """A new RUNNING trial of this worker; with ``fixed`` params, created with them in one INSERT. Not through
        Optuna's enqueue + ask: its WAITING queue is shared by every worker of the study, so another worker's ask
        could pop the config this one chose (and this one get the other's)."""
        if fixed is None:
            trial = self.study.ask()
            if self.worker is not None:
                trial.set_user_attr("worker", self.worker)
            return trial
        template = create_trial(
            state=TrialState.RUNNING,
            system_attrs={"fixed_params": fixed},
            user_attrs={"worker": self.worker} if self.worker is not None else {},
        )
        trial_id = self.study._storage.create_new_trial(self.study._study_id, template_trial=template)
        self.study._thread_local.cached_all_trials = None  # as Study.ask: the next read sees the new trial
        return optuna.trial.Trial(self.study, trial_id)

    def _ask_baseline(self, seconds_left: float | None) -> Proposal:
        baseline = self.setup.baseline
        assert baseline is not None
        trial = self._ask()
        trial.set_user_attr("fidelity", Fidelity.BASELINE.value)
        config = self._probe_config(baseline, Fidelity.BASELINE, seconds_left)
        key = config_key(baseline, self.setup.world_size, config.gradient_accumulation_steps)
        return Proposal(config, Fidelity.BASELINE, key, trial, self.expected_seconds(Fidelity.SHORT))

    def _propose_knobs(self, stuck: int) -> Knobs | None:
        """The proposers in order (see tuner.search.proposers); None: TPE samples the next trial."""
        if stuck == 0:
            if not self._opened:
                opened = self._apply(proposers.opening(self.context, self.evidence))
                self._opened = self._opened or opened.done
                if opened.knobs is not None:
                    return opened.knobs
            if not self._walled and self.schedule.seed_bisection:
                walled = proposers.past_wall(self.context, self.evidence)
                self._walled = walled.done
                if walled.knobs is not None:
                    return walled.knobs
            guided = self._apply(proposers.guided(self.context, self.evidence))
            if guided.converged:
                self.exhausted = self.converged = True
                return None
            if guided.knobs is not None:
                return guided.knobs
        if stuck >= self.schedule.stuck_asks:
            pick = proposers.random_unknown(self.context, self.evidence)
            if pick.done:
                self.exhausted = True
            return pick.knobs
        return None

    def _apply(self, proposed: proposers.Proposed) -> proposers.Proposed:
        for knobs in proposed.ruled_out:  # the OOM boundary, recorded once so `tuner trials` shows what never ran
            self._record_inferred(knobs)
        return proposed

    def _explore(self, seconds_left: float | None) -> Proposal | None:
        stuck = 0
        while True:
            knobs = self._propose_knobs(stuck)
            if self.exhausted:
                return None
            if knobs is not None and stuck >= self.schedule.stuck_asks:
                stuck = 0
            trial, knobs, key = self._ask_short(fixed_params(knobs) if knobs is not None else None)
            earlier = self.evidence.measured(key)
            if earlier is not None:
                self._tell_reused(trial, earlier)
                stuck += 1
                continue
            if key in self.evidence.skipped:
                self._tell_skipped(trial)
                stuck += 1
                continue
            config = self._probe_config(knobs, Fidelity.SHORT, seconds_left)
            inference = self.evidence.infer(knobs)
            if inference.verdict == "oom":
                self._tell_inferred(trial, config, key, inference.cause, inference.estimate)
                stuck += 1
                continue
            return Proposal(
                config, Fidelity.SHORT, key, trial, self.expected_seconds(Fidelity.SHORT), inference.estimate
            )

    def _ask_short(self, fixed: dict[str, Any] | None = None) -> tuple[optuna.trial.Trial, Knobs, str]:
        """A short-fidelity trial: the ``fixed`` params, else TPE's; tagged with its knobs and config key."""
        trial = self._ask(fixed)
        knobs = self.setup.space.sample(trial)
        key = self.context.key(knobs)
        trial.set_user_attr("fidelity", Fidelity.SHORT.value)
        trial.set_user_attr("knobs", knobs.model_dump(mode="json"))
        trial.set_user_attr("config_key", key)
        return trial, knobs, key

    def _record_inferred(self, knobs: Knobs) -> None:
        trial, knobs, key = self._ask_short(fixed_params(knobs))
        config = self._probe_config(knobs, Fidelity.SHORT, None)
        inference = self.evidence.infer(knobs)
        if inference.verdict == "oom":
            self._tell_inferred(trial, config, key, inference.cause, inference.estimate)
        else:  # cannot happen (the proposer asked the same evidence); never leave a trial running
            self._tell_skipped(trial, "not ruled out after all")

    def _confirm(self, seconds_left: float | None) -> Proposal | None:
        if not self._fits_in(Fidelity.CONFIRM, seconds_left):
            return None
        cand = confirm.next_finalist(candidates(self.rows), self._claimed_confirm, self.schedule)
        if cand is None:
            return None
        self._claimed_confirm.add(cand.config_key)
        config = self._probe_config(Knobs.model_validate(cand.knobs), Fidelity.CONFIRM, seconds_left)
        return Proposal(config, Fidelity.CONFIRM, cand.config_key, None, self.expected_seconds(Fidelity.CONFIRM))

    # -- observing ---------------------------------------------------------------------------------------------------
    def row_for(self, proposal: Proposal, result: ProbeResult) -> ProbeRow:
        s = self.setup
        return probe_row(
            proposal.config,
            result,
            trial_number=proposal.trial_number,
            fidelity=proposal.fidelity,
            config_key=proposal.config_key,
            estimate_bytes=proposal.estimate_bytes,
            objective=s.objective,
            device_memory=s.device_memory,
            headroom=s.headroom,
        )

    def observe(
        self, proposal: Proposal, result: ProbeResult, record: Callable[[ProbeRow], None] | None = None
    ) -> Outcome:
        """Records a probe's result: the trial is told COMPLETE, PRUNED (OOM) or FAIL (error/timeout). ``record``
        (the driver's store) gets the row first: a measurement is kept before Optuna hears of it."""
        row = self.row_for(proposal, result)
        if record is not None:
            record(row)
        self.evidence.add(row)
        if proposal.fidelity == Fidelity.SHORT:
            self.explored += 1
        state = self._tell(proposal.trial, row) if proposal.trial is not None else None
        return Outcome(row=row, state=state, objective=row.objective, stable=row.stable)

    def observe_row(self, proposal: Proposal, row: ProbeRow) -> TrialState | None:
        """Another worker measured this config first: reuse its row instead of probing."""
        if proposal.trial is None:
            return None
        return self._tell_reused(proposal.trial, row)

    def abandon(self, proposal: Proposal, cause: str) -> None:
        """The proposal will not be probed (e.g. another worker is probing it right now)."""
        self.evidence.skipped.add(proposal.config_key)
        if proposal.trial is not None:
            self._tell_skipped(proposal.trial, cause)

    def _tell_skipped(self, trial: optuna.trial.Trial, cause: str = "being probed by another worker") -> None:
        tell_skipped(self.study, trial, cause)

    def _tell(self, trial: optuna.trial.Trial, row: ProbeRow) -> TrialState:
        return tell(self.study, trial, row, self.setup.headroom)

    def _tell_reused(self, trial: optuna.trial.Trial, row: ProbeRow) -> TrialState:
        trial.set_user_attr("reused_from", row.trial_number)
        self.reused += 1
        return self._tell(trial, row)

    def _tell_inferred(
        self, trial: optuna.trial.Trial, config: ProbeConfig, key: str, cause: str | None, estimate: int | None
    ) -> None:
        row = inferred_row(trial.number, config, key, cause, estimate, self.setup.device_memory)
        self._tell(trial, row)
        self.evidence.add(row)  # an inferred row: the evidence keeps it, the frontier learns nothing from it
        self.events.append(row)
        self.inferred += 1
