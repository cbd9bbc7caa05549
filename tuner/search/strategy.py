"""The search's decision logic, separate from execution: what to probe next, and what a result means.

``Strategy`` works on an Optuna study (in memory or RDB) and never runs anything itself: ``propose(seconds_left)``
returns the next ProbeConfig to run (or None when done) and ``observe(proposal, result)`` records what came back.
tuner/search/driver.py drives it with the real runner and the database; benchmarks/replay.py drives it with a table
lookup and a simulated clock. The phases:

1. baseline: the user's current config (``--baseline``) is probed first, as trial 0.
2. explore: an opening at the plainest config (the largest micro batch the memory estimate predicts stable, else a
   micro-batch bisection), then the guide (tuner.search.guide: constrained expected improvement over a throughput model
   of every probe) proposes, until no config is expected to gain 0.1%; TPE proposes only with ``Schedule(guide=False)``.
   Duplicates reuse the earlier measurement; configs the feasibility frontier (or the memory estimate) says must OOM are
   recorded as PRUNED trials with cause "inferred-oom" without running. OOM probes are PRUNED with a positive constraint
   (``trial.set_constraint``) so TPE, where it proposes, learns the infeasible region.
3. confirm: the best stable configs (finalists) are re-probed with more measured steps; selection ranks them on a
   lower bound of their throughput given every probe's evidence (tuner.search.selection).

The state is the list of probe rows (the shape of tuner_probes rows): ``load_rows`` replaces it with the database's
rows so several workers and resumed searches see each other's measurements.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import optuna
from optuna.trial import TrialState

from trials.contract import Knobs, ModelSpec, ProbeConfig, ProbeResult
from tuner.errors import TunerError
from tuner.job.batching import accumulation_steps
from tuner.job.objective import Objective
from tuner.job.space import Space, config_key
from tuner.memory.frontier import Frontier
from tuner.search.guide import guide_step
from tuner.search.rows import inferred_row, probe_row, tell, tell_skipped
from tuner.search.sampling import PlainSuggester, fixed_params, make_sampler
from tuner.search.schedule import Schedule, budgeted_seconds, expected_seconds, timeout_for
from tuner.search.selection import MEASURED, best_stable, candidates


def _fits(row: dict[str, Any]) -> bool | None:
    """What a measured row tells the frontier: fits (stable), does not fit (OOM or above the headroom), or nothing."""
    status = row.get("status")
    if status == "oom" or (status == "ok" and not row.get("stable")):
        return False
    return True if status == "ok" else None


__all__ = ["EstimatorLike", "Outcome", "Proposal", "Schedule", "Strategy", "make_sampler"]

Fidelity = Literal["baseline", "short", "confirm"]


class EstimatorLike(Protocol):
    """tuner.memory.estimator.Estimator: predicted peak bytes per rank, recalibrated on every measured peak."""

    def predict(self, knobs: Knobs) -> Any: ...  # an object with ``.calibrated`` bytes

    def observe(self, knobs: Knobs, measured_peak: int) -> None: ...


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
    row: dict[str, Any]  # a tuner_probes row (without run_id/study_name)
    state: TrialState | None  # what the Optuna trial was told (None for confirm probes)
    objective: float | None
    stable: bool


@dataclass
class Strategy:
    study: optuna.Study
    space: Space
    model: ModelSpec
    world_size: int
    global_batch: int
    objective: Objective
    device_memory: int | None = None
    headroom: float = 0.9
    schedule: Schedule = field(default_factory=Schedule)
    baseline: Knobs | None = None
    n_trials: int | None = None  # explore probes this strategy may run (inferred/duplicates are free)
    estimator: EstimatorLike | None = None
    seed: int | None = None
    frontier: Frontier = field(default_factory=Frontier)  # e.g. Frontier(stage_need=...) to order ZeRO stages
    worker: str | None = None  # tagged on every trial asked, so a resume can fail the trials of a dead worker

    def __post_init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self._in_frontier: set[str] = set()
        self.events: list[dict[str, Any]] = []  # inferred rows the driver should store
        self.explored = 0
        self.inferred = 0
        self.reused = 0
        self._exhausted = False
        self.converged = False  # the guide expects no unprobed config to beat the best (Schedule.min_expected_gain)
        self._claimed_confirm: set[str] = set()
        self._skipped: set[str] = set()  # configs another worker holds a claim on
        self._seeded = False
        self._rng = random.Random(self.seed)
        self._grid: list[Knobs] | None = None

    # -- state -------------------------------------------------------------------------------------------------------
    def load_rows(self, rows: list[dict[str, Any]]) -> None:
        """Replaces the known probe rows (e.g. with the database's, including other workers')."""
        self.rows = list(rows)
        for row in self.rows:
            self._learn(row)

    def _learn(self, row: dict[str, Any]) -> None:
        key = row["config_key"]
        if row.get("fidelity") not in MEASURED or key in self._in_frontier:
            return
        fits = _fits(row)
        if fits is None:
            return  # timeouts and errors say nothing about memory
        self.frontier.add(row["knobs"], fits=fits)
        self._in_frontier.add(key)
        if row.get("status") == "ok" and row.get("peak_allocated") and self.estimator is not None:
            self.estimator.observe(Knobs.model_validate(row["knobs"]), int(row["peak_allocated"]))

    def use_frontier(self, frontier: Frontier) -> None:
        """Swaps in another frontier (e.g. one ordering ZeRO stages) and feeds it every measurement so far."""
        self.frontier = frontier
        fed: set[str] = set()
        for row in self.rows:
            key = row["config_key"]
            if row.get("fidelity") in MEASURED and key in self._in_frontier and key not in fed:
                fed.add(key)
                fits = _fits(row)
                if fits is not None:
                    frontier.add(row["knobs"], fits=fits)

    def _measured(self, key: str) -> dict[str, Any] | None:
        """The first measured row of ``key``, else its inferred row (so an inference is recorded once)."""
        inferred = None
        for row in self.rows:
            if row["config_key"] == key:
                if row.get("fidelity") in MEASURED:
                    return row
                inferred = inferred or row
        return inferred

    def _known(self) -> set[str]:
        return {r["config_key"] for r in self.rows} | self._skipped

    def drain(self) -> list[dict[str, Any]]:
        out, self.events = self.events, []
        return out

    def best(self) -> Any:
        return best_stable(self.rows)

    # -- time model (tuner.search.schedule) ---------------------------------------------------------------------
    def expected_seconds(self, fidelity: Fidelity) -> float:
        return expected_seconds(self.rows, self.schedule, fidelity)

    def timeout_for(self, fidelity: Fidelity, seconds_left: float | None, knobs: Knobs | None = None) -> float:
        return timeout_for(self.rows, self.schedule, fidelity, seconds_left, knobs)

    # -- proposing ---------------------------------------------------------------------------------------------------
    def _probe_config(self, knobs: Knobs, fidelity: Fidelity, seconds_left: float | None) -> ProbeConfig:
        accum = accumulation_steps(self.global_batch, knobs.micro_batch_size, self.world_size)
        if accum is None:  # the space is restricted to reachable micro batches; a baseline may not be
            raise ValueError(f"micro batch {knobs.micro_batch_size} cannot reach global batch {self.global_batch}")
        warmup, measure = self.schedule.confirm if fidelity == "confirm" else self.schedule.short
        return ProbeConfig(
            model=self.model,
            knobs=knobs,
            world_size=self.world_size,
            gradient_accumulation_steps=accum,
            warmup_steps=warmup,
            measure_steps=measure,
            device_memory=self.device_memory,
            timeout_s=self.timeout_for(fidelity, seconds_left, knobs),
            seed=self.seed or 0,
        )

    def _fits_in(self, fidelity: Fidelity, seconds_left: float | None) -> bool:
        if seconds_left is None:
            return True
        return budgeted_seconds(self.rows, self.schedule, fidelity, seconds_left) <= seconds_left

    def _baseline_pending(self) -> bool:
        if self.baseline is None:
            return False
        return not any(r.get("fidelity") == "baseline" for r in self.rows)

    def _explore_done(self, seconds_left: float | None) -> bool:
        if self._exhausted or (self.n_trials is not None and self.explored >= self.n_trials):
            return True
        if seconds_left is None:
            return False
        # keep time for the finalists' confirm probes, but only for as many as can still fit: when not even one
        # confirm fits, the time left goes to short probes instead of being kept for nothing
        pending = len([c for c in candidates(self.rows) if not c.confirmed][: self.schedule.finalists])
        confirm_s = self.expected_seconds("confirm")
        reserve = min(pending, int(seconds_left // confirm_s)) * confirm_s if confirm_s > 0 else 0.0
        return seconds_left - reserve < budgeted_seconds(self.rows, self.schedule, "short", seconds_left)

    def propose(self, seconds_left: float | None = None) -> Proposal | None:
        """The next probe to run, or None when the search is done (budget, trials or space exhausted)."""
        if self._baseline_pending() and self.baseline is not None and self._fits_in("short", seconds_left):
            return self._ask_baseline(seconds_left)
        if not self._explore_done(seconds_left):
            proposal = self._explore(seconds_left)
            if proposal is not None:
                return proposal
        return self._confirm(seconds_left)

    def _ask(self) -> optuna.trial.Trial:
        trial = self.study.ask()
        if self.worker is not None:
            trial.set_user_attr("worker", self.worker)
        return trial

    def _ask_baseline(self, seconds_left: float | None) -> Proposal:
        assert self.baseline is not None
        trial = self._ask()
        trial.set_user_attr("fidelity", "baseline")
        config = self._probe_config(self.baseline, "baseline", seconds_left)
        key = config_key(self.baseline, self.world_size, config.gradient_accumulation_steps)
        return Proposal(config, "baseline", key, trial, self.expected_seconds("short"))

    def _pick_unknown(self) -> Knobs | None:
        if self._grid is None:
            self._grid = list(self.space.configs())
        known = self._known()
        fresh = [
            k
            for k in self._grid
            if config_key(k, self.world_size, self._accum(k)) not in known and self.frontier.infer(k) != "oom"
        ]
        return self._rng.choice(fresh) if fresh else None

    def _accum(self, knobs: Knobs) -> int:
        return accumulation_steps(self.global_batch, knobs.micro_batch_size, self.world_size) or 0

    def _plain(self, micro: int) -> Knobs:
        return self.space.sample(PlainSuggester(micro))

    def _next_seed(self) -> Knobs | None:
        """Bisection over the micro batch at the plainest config (lowest overhead: lowest ZeRO stage, no
        checkpointing, no offload): the largest micro batch that fits there is usually the fastest config, and each
        probe settles half of the remaining micro batches through the frontier. TPE takes over from there."""
        if not self.schedule.seed_bisection or self._seeded:
            return None
        known = self._known()
        unknown = [
            k
            for k in map(self._plain, sorted(self.space.micro_batch_size))
            if config_key(k, self.world_size, self._accum(k)) not in known and self.frontier.infer(k) is None
        ]
        if not unknown:
            self._seeded = True
            return None
        limit = self.headroom * self.device_memory if self.device_memory else None
        if self.estimator is not None and limit and self.device_memory:
            # the memory estimate already knows the boundary: one probe at the largest micro batch predicted stable
            self._seeded = True
            estimates = {k.micro_batch_size: self._estimate(k) for k in unknown}
            margin = self.schedule.estimate_margin * self.device_memory
            far = [k for k in unknown if (est := estimates[k.micro_batch_size]) is not None and est > margin]
            if far:  # the boundary of what the estimate rules out at this config goes on record, never run
                self._record_inferred(far[0])
            fitting = [k for k in unknown if (est := estimates[k.micro_batch_size]) is not None and est <= limit]
            return fitting[-1] if fitting else unknown[0]
        return unknown[len(unknown) // 2]

    def _guided(self) -> Knobs | None:
        """The config with the highest constrained expected improvement (tuner.search.guide), once a probe has finished;
        None (TPE proposes) before that or with ``Schedule.guide`` off."""
        if not self.schedule.guide:
            return None
        if self._grid is None:
            self._grid = list(self.space.configs())
        capacity = self.device_memory or max((int(r.get("capacity") or 0) for r in self.rows), default=0)
        step = guide_step(
            self._grid,
            self.rows,
            self.frontier,
            self._estimate if self.estimator is not None else None,
            known=self._known(),
            key=lambda k: config_key(k, self.world_size, self._accum(k)),
            capacity=capacity,
            headroom=self.headroom,
            estimate_margin=self.schedule.estimate_margin,
        )
        for k in step.ruled_out:  # the OOM boundary, recorded once so `tuner trials` shows what was never probed
            self._record_inferred(k)
        choice = step.choice
        if choice is not None and step.best is not None and choice.score < self.schedule.min_expected_gain:
            self._exhausted = self.converged = True  # no config left is expected to gain; finalists are confirmed next
            return None
        return choice.knobs if choice is not None else None

    def _explore(self, seconds_left: float | None) -> Proposal | None:
        stuck = 0
        while True:
            seed = self._next_seed() if stuck == 0 else None
            if seed is None and stuck == 0:
                seed = self._guided()
                if self._exhausted:
                    return None
            if seed is not None:
                self.study.enqueue_trial(fixed_params(seed), skip_if_exists=False)
            elif stuck >= self.schedule.stuck_asks:
                pick = self._pick_unknown()
                if pick is None:
                    self._exhausted = True
                    return None
                self.study.enqueue_trial(fixed_params(pick), skip_if_exists=False)
                stuck = 0
            trial, knobs, key = self._ask_short()
            earlier = self._measured(key)
            if earlier is not None:
                self._tell_reused(trial, earlier)
                stuck += 1
                continue
            if key in self._skipped:
                self._tell_skipped(trial)
                stuck += 1
                continue
            config = self._probe_config(knobs, "short", seconds_left)
            verdict, cause, estimate = self._infer(knobs, config)
            if verdict == "oom":
                self._tell_inferred(trial, config, key, cause, estimate)
                stuck += 1
                continue
            return Proposal(config, "short", key, trial, self.expected_seconds("short"), estimate)

    def _ask_short(self) -> tuple[optuna.trial.Trial, Knobs, str]:
        """A short-fidelity trial: the next enqueued params, else TPE's; tagged with its knobs and config key."""
        trial = self._ask()
        knobs = self.space.sample(trial)
        key = config_key(knobs, self.world_size, self._accum(knobs))
        trial.set_user_attr("fidelity", "short")
        trial.set_user_attr("knobs", knobs.model_dump(mode="json"))
        trial.set_user_attr("config_key", key)
        return trial, knobs, key

    def _record_inferred(self, knobs: Knobs) -> None:
        self.study.enqueue_trial(fixed_params(knobs), skip_if_exists=False)
        trial, knobs, key = self._ask_short()
        config = self._probe_config(knobs, "short", None)
        verdict, cause, estimate = self._infer(knobs, config)
        if verdict == "oom":
            self._tell_inferred(trial, config, key, cause, estimate)
        else:  # cannot happen (the guide asked the same frontier and estimate); never leave a trial running
            self._tell_skipped(trial, "not ruled out after all")

    def _infer(self, knobs: Knobs, config: ProbeConfig) -> tuple[str | None, str | None, int | None]:
        if self.frontier.infer(knobs) == "oom":
            return "oom", self.frontier.explain(knobs), None
        estimate = self._estimate(knobs)
        capacity = self.device_memory or max((int(r.get("capacity") or 0) for r in self.rows), default=0)
        if estimate is not None and capacity and estimate > self.schedule.estimate_margin * capacity:
            margin = self.schedule.estimate_margin
            cause = f"inferred-oom: estimated peak {estimate / 2**20:.0f} MiB > {margin:g} x capacity"
            return "oom", cause, estimate
        return None, None, estimate

    def _estimate(self, knobs: Knobs) -> int | None:
        if self.estimator is None:
            return None
        try:
            return int(self.estimator.predict(knobs).calibrated)
        except TunerError:  # e.g. no traced point for this checkpointing/precision: no estimate, probe it
            return None

    def _confirm(self, seconds_left: float | None) -> Proposal | None:
        if not self._fits_in("confirm", seconds_left):
            return None
        found = candidates(self.rows)
        confirmed = [c for c in found if c.confirmed]
        best_confirmed = max((c.score for c in confirmed), default=None)
        for rank, cand in enumerate(c for c in found if not c.confirmed):
            if cand.config_key in self._claimed_confirm:
                continue
            within_top = rank < self.schedule.finalists and len(confirmed) < self.schedule.finalists
            # beyond the top finalists: a config whose upper bound still reaches the best confirmed one's lower bound
            # (measurements too noisy to tell them apart), up to max_finalists confirmed in all
            contender = (
                best_confirmed is not None
                and cand.upper > best_confirmed
                and len(confirmed) < self.schedule.max_finalists
            )
            if not within_top and not contender and (best_confirmed is None or cand.score <= best_confirmed):
                return None
            knobs = Knobs.model_validate(cand.knobs)
            self._claimed_confirm.add(cand.config_key)
            config = self._probe_config(knobs, "confirm", seconds_left)
            return Proposal(config, "confirm", cand.config_key, None, self.expected_seconds("confirm"))
        return None

    # -- observing ---------------------------------------------------------------------------------------------------
    def row_for(self, proposal: Proposal, result: ProbeResult) -> dict[str, Any]:
        return probe_row(
            proposal.config,
            result,
            trial_number=proposal.trial_number,
            fidelity=proposal.fidelity,
            config_key=proposal.config_key,
            estimate_bytes=proposal.estimate_bytes,
            objective=self.objective,
            device_memory=self.device_memory,
            headroom=self.headroom,
        )

    def observe(self, proposal: Proposal, result: ProbeResult) -> Outcome:
        """Records a probe's result: the trial is told COMPLETE, PRUNED (OOM) or FAIL (error/timeout)."""
        row = self.row_for(proposal, result)
        self.rows.append(row)
        self._learn(row)
        if proposal.fidelity == "short":
            self.explored += 1
        state = self._tell(proposal.trial, row) if proposal.trial is not None else None
        return Outcome(row=row, state=state, objective=row["objective"], stable=row["stable"])

    def observe_row(self, proposal: Proposal, row: dict[str, Any]) -> TrialState | None:
        """Another worker measured this config first: reuse its row instead of probing."""
        if proposal.trial is None:
            return None
        return self._tell_reused(proposal.trial, row)

    def abandon(self, proposal: Proposal, cause: str) -> None:
        """The proposal will not be probed (e.g. another worker is probing it right now)."""
        self._skipped.add(proposal.config_key)
        if proposal.trial is not None:
            self._tell_skipped(proposal.trial, cause)

    def _tell_skipped(self, trial: optuna.trial.Trial, cause: str = "being probed by another worker") -> None:
        tell_skipped(self.study, trial, cause)

    def _tell(self, trial: optuna.trial.Trial, row: dict[str, Any]) -> TrialState:
        return tell(self.study, trial, row, self.headroom)

    def _tell_reused(self, trial: optuna.trial.Trial, row: dict[str, Any]) -> TrialState:
        trial.set_user_attr("reused_from", row.get("trial_number"))
        self.reused += 1
        return self._tell(trial, row)

    def _tell_inferred(
        self, trial: optuna.trial.Trial, config: ProbeConfig, key: str, cause: str | None, estimate: int | None
    ) -> None:
        row = inferred_row(trial.number, config, key, cause, estimate, self.device_memory)
        self._tell(trial, row)
        self.rows.append(row)
        self.events.append(row)
        self.inferred += 1
