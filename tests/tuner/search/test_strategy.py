"""The strategy's decision logic on a small deterministic table standing in for measurements (no probes run here)."""

import optuna
import pytest
from optuna.trial import TrialState

from trials.contract import Knobs, ModelSpec, ProbeResult, RankMemory
from tuner.job.objective import objective_for
from tuner.job.space import space_from_dict
from tuner.search.sampling import make_sampler
from tuner.search.schedule import Schedule
from tuner.search.selection import best_stable
from tuner.search.strategy import SearchSetup, Strategy

MiB = 2**20
CAPACITY = 100 * MiB

optuna.logging.set_verbosity(optuna.logging.WARNING)


def table_probe(config):
    """Memory grows with micro batch, shrinks with ZeRO stage and checkpointing; speed grows with micro batch."""
    k = config.knobs
    peak = k.micro_batch_size * (12 - 2 * k.zero_stage) * (0.5 if k.gradient_checkpointing else 1.0) * MiB
    wall = 3.0 + (config.warmup_steps + config.measure_steps) * (0.3 + 0.02 * k.micro_batch_size)
    if k.max_length == 999:
        return ProbeResult(status="error", cause="RuntimeError: boom", wall_s=wall)
    if peak > CAPACITY:
        return ProbeResult(status="oom", cause="emulated device OOM", wall_s=wall, setup_s=3.0)
    sps = k.micro_batch_size * (1.0 if not k.gradient_checkpointing else 0.7) * (1 - 0.05 * k.zero_stage)
    return ProbeResult(
        status="ok",
        samples_per_s=sps,
        tokens_per_s=sps * k.max_length,
        ranks=[RankMemory(rank=0, peak_allocated=int(peak), capacity=CAPACITY)],
        capacity=CAPACITY,
        wall_s=wall,
        setup_s=3.0,
    )


def make(space_dict, *, n_trials=None, baseline=None, schedule=None, global_batch=64, study=None, seed=0):
    space = space_from_dict(space_dict)
    study = study or optuna.create_study(direction="maximize", sampler=make_sampler(seed))
    setup = SearchSetup(
        space=space,
        model=ModelSpec(),
        world_size=1,
        global_batch=global_batch,
        objective=objective_for(space.max_length),
        device_memory=CAPACITY,
        headroom=0.9,
        schedule=schedule or Schedule(),
        baseline=baseline,
        n_trials=n_trials,
        seed=seed,
    )
    return Strategy(study, setup)


def drive(strategy, budget_s=None):
    """A replay-style loop on a simulated clock: each probe is charged its table seconds."""
    clock, probed = 0.0, []
    while True:
        left = None if budget_s is None else budget_s - clock
        p = strategy.propose(left)
        if p is None:
            return probed, clock
        if left is not None:
            assert p.config.timeout_s <= left
        result = table_probe(p.config)
        clock += result.wall_s
        probed.append(p)
        strategy.observe(p, result)


SMALL = {
    "micro_batch_size": [1, 2, 4, 8, 16, 32, 64],
    "max_length": [128],
    "zero_stage": [0],
    "gradient_checkpointing": [False],
}


def test_every_config_probed_once_and_the_best_stable_wins():
    s = make(SMALL)
    probed, _ = drive(s)
    shorts = [p.config_key for p in probed if p.fidelity == "short"]
    assert len(shorts) == len(set(shorts))
    best = best_stable(s.rows)
    # micro 8 peaks at 96 MiB > 90% of 100 MiB: OOM-free but unstable; micro 4 is the best stable
    assert best.knobs["micro_batch_size"] == 4 and best.confirmed
    trials = {t.user_attrs["knobs"]["micro_batch_size"]: t for t in s.study.trials if "knobs" in t.user_attrs}
    # micro 8 ran above the headroom, so every larger micro batch must run out of memory: the boundary (16) is
    # recorded as a pruned inferred-oom trial without running, and nothing larger is asked at all
    assert trials[16].state == TrialState.PRUNED and trials[16].user_attrs["status"] == "inferred-oom"
    assert 16 not in [p.config.knobs.micro_batch_size for p in probed]
    assert 32 not in trials and 64 not in trials


def test_oom_is_pruned_with_a_positive_constraint_and_ok_is_complete():
    s = make(SMALL)
    drive(s)
    measured_oom = make({**SMALL, "micro_batch_size": [16]}, n_trials=1)  # 192 MiB > 100 MiB: nothing to infer from
    drive(measured_oom)
    by_status: dict[str, list] = {}
    for t in [*s.study.trials, *measured_oom.study.trials]:
        by_status.setdefault(t.user_attrs["status"], []).append(t)
    assert sorted(by_status) == ["inferred-oom", "ok", "oom"]
    for t in by_status["oom"] + by_status["inferred-oom"]:
        assert t.state == TrialState.PRUNED and t.constraints["memory"] > 0
    ok = by_status["ok"]
    assert {t.user_attrs["stable"] for t in ok} == {True, False}  # micro 8 peaks above the headroom, 2 and 4 below
    for t in ok:
        assert t.state == TrialState.COMPLETE
        assert (t.constraints["memory"] <= 0) == t.user_attrs["stable"]


def test_frontier_infers_larger_micro_batches_without_probing():
    s = make(SMALL)
    probed, _ = drive(s)
    rows = {r.config_key: r for r in s.rows if r.fidelity == "short"}
    smallest_unfit = None  # the smallest micro batch measured not to fit (OOM, or above the headroom) so far
    for p in (p for p in probed if p.fidelity == "short"):
        micro = p.config.knobs.micro_batch_size
        assert smallest_unfit is None or micro < smallest_unfit, "probed a config the frontier knew would not fit"
        if not rows[p.config_key].stable:
            smallest_unfit = micro if smallest_unfit is None else min(smallest_unfit, micro)
    assert smallest_unfit == 8  # the first probe: the frontier had a boundary to infer from for the rest
    inferred = [r for r in s.rows if r.status == "inferred-oom"]
    assert inferred and all(r.fidelity == "inferred" and "inferred-oom" in r.cause for r in inferred)
    assert s.inferred == len(inferred)
    assert len({r.config_key for r in inferred}) == len(inferred), "an inference was recorded twice"
    # the boundary is on record: the smallest micro batch never probed because it must OOM (16: 8 is unstable)
    assert min(r.knobs["micro_batch_size"] for r in inferred) == 16
    assert max(p.config.knobs.micro_batch_size for p in probed) == 8


def test_errors_fail_the_trial_with_the_cause():
    s = make({"micro_batch_size": [1], "max_length": [999], "zero_stage": [0]}, n_trials=1)
    drive(s)
    (t,) = [t for t in s.study.trials if t.user_attrs.get("status")]
    assert t.state == TrialState.FAIL and t.user_attrs["cause"] == "RuntimeError: boom"


def test_global_batch_is_reached_exactly_by_every_probe():
    s = make({**SMALL, "zero_stage": [0, 1, 2]}, global_batch=64)
    probed, _ = drive(s, budget_s=200)
    assert probed
    for p in probed:
        c = p.config
        assert c.knobs.micro_batch_size * c.gradient_accumulation_steps * c.world_size == 64


def test_budget_stops_before_a_probe_that_cannot_finish():
    s = make({**SMALL, "zero_stage": [0, 1, 2, 3], "gradient_checkpointing": [False, True]})
    _probed, clock = drive(s, budget_s=40)
    assert clock <= 40
    assert s.propose(0.5) is None


def test_n_trials_then_finalists_are_confirmed_with_longer_probes():
    s = make({**SMALL, "zero_stage": [0, 1, 2, 3]}, n_trials=6, schedule=Schedule(finalists=2))
    probed, _ = drive(s)
    assert sum(p.fidelity == "short" for p in probed) == 6
    confirms = [p for p in probed if p.fidelity == "confirm"]
    assert 1 <= len(confirms) <= 2 + 6
    assert all(p.trial is None and p.config.measure_steps == Schedule().confirm[1] for p in confirms)
    assert best_stable(s.rows).confirmed


def test_baseline_is_trial_zero():
    base = Knobs(micro_batch_size=2, max_length=128, zero_stage=0)
    s = make(SMALL, baseline=base, n_trials=2)
    probed, _ = drive(s)
    assert probed[0].fidelity == "baseline" and probed[0].trial_number == 0
    assert s.study.trials[0].user_attrs["fidelity"] == "baseline"
    assert sum(p.fidelity == "baseline" for p in probed) == 1


def test_rows_from_another_worker_feed_the_frontier_and_are_not_reprobed():
    first = make(SMALL, n_trials=3)
    drive(first)
    second = make(SMALL, study=first.study)
    second.load_rows(first.rows)
    probed, _ = drive(second)
    before = {r.config_key for r in first.rows if r.fidelity == "short"}
    assert not [p for p in probed if p.fidelity == "short" and p.config_key in before]


def test_timeouts_follow_measured_probe_durations():
    s = make(SMALL, n_trials=3)
    drive(s)
    longest = max(r.probe_seconds for r in s.rows if r.probe_seconds)
    assert s.time.timeout("short", None) == pytest.approx(3 * longest + 30)
    assert s.time.timeout("short", 7.0) == 7.0
    assert s.time.expected("confirm") > s.time.expected("short")
    small, big = Knobs(micro_batch_size=1, max_length=128), Knobs(micro_batch_size=64, max_length=128)
    assert s.time.timeout("short", None, big) > s.time.timeout("short", None, small) >= 3 * longest + 30


def test_retained_tokens_objective_in_rows():
    s = make({**SMALL, "max_length": [64, 128]}, n_trials=4)
    assert s.setup.objective.kind == "retained_tokens_per_s"
    drive(s)
    ok = [r for r in s.rows if r.status == "ok"]
    assert ok and all(r.objective == pytest.approx(r.samples_per_s * r.knobs["max_length"]) for r in ok)


def test_estimator_skips_configs_far_over_budget():
    class Est:
        def __init__(self):
            self.seen = []

        def predict(self, knobs):
            return type("E", (), {"calibrated": knobs.micro_batch_size * 12 * MiB})()

        def observe(self, knobs, peak):
            self.seen.append(peak)

    # no bisection, no guide: TPE proposes, and the estimate alone must skip (and record) the ones far over budget
    s = make(SMALL, schedule=Schedule(seed_bisection=False, guide=False))
    s.estimator = Est()
    probed, _ = drive(s)
    assert all(p.config.knobs.micro_batch_size * 12 <= 150 for p in probed)  # 1.5 x 100 MiB
    assert s.estimator.seen and any("estimated peak" in (r.cause or "") for r in s.rows)
    inferred = [r.config_key for r in s.rows if r.fidelity == "inferred"]
    assert len(set(inferred)) == len(inferred), "an inference was recorded twice"


def test_search_opens_with_a_micro_batch_bisection_at_the_plainest_config():
    space = {
        "micro_batch_size": [1, 2, 4, 8, 16, 32, 64],
        "max_length": [128],
        "zero_stage": [0, 1, 2],
        "gradient_checkpointing": [False, True],
        "offload_optimizer": [False, True],
    }
    s = make(space)
    first = []
    for _ in range(3):
        p = s.propose(None)
        first.append(p.config.knobs)
        s.observe(p, table_probe(p.config))
    assert all(k.zero_stage == 0 and not k.gradient_checkpointing and not k.offload_optimizer for k in first)
    # 8 first (the middle); 8 peaks above 90% of capacity (unstable), so 2 or 4 next: a binary search
    assert first[0].micro_batch_size == 8
    assert first[1].micro_batch_size in (2, 4) and first[2].micro_batch_size in (1, 2, 4)


def test_time_too_short_for_a_confirm_goes_to_short_probes():
    s = make({**SMALL, "micro_batch_size": [1, 2, 4]}, schedule=Schedule(finalists=2))
    p = s.propose(None)
    assert s.observe(p, table_probe(p.config)).stable  # one stable short probe: a finalist is pending
    short, confirm = s.time.expected("short"), s.time.expected("confirm")
    assert confirm > short
    between = (short + confirm) / 2  # a short probe fits, a confirm does not
    nxt = s.propose(between)
    assert nxt is not None and nxt.fidelity == "short"
    s.observe(nxt, table_probe(nxt.config))
    enough = s.time.expected("confirm") + s.time.expected("short") / 2  # one confirm fits, not both
    assert s.propose(enough).fidelity == "confirm"


def test_a_budget_shorter_than_the_first_probe_guess_still_runs_the_first_probe_within_it():
    s = make(SMALL)
    assert Schedule().first_probe_s > 10  # the guess before anything was measured
    first = s.propose(10.0)
    assert first is not None and first.config.timeout_s <= 10.0  # killed at the budget if it does not finish
    assert make(SMALL).propose(0.5) is None  # less than the shortest timeout: nothing starts
    s.observe(first, table_probe(first.config))  # measured: from now on the measured times decide
    assert s.propose(s.time.expected("short") / 2) is None


def test_a_config_that_cannot_be_told_apart_from_the_best_confirmed_one_is_confirmed_too():
    speed = {1: 5.0, 2: 9.8, 4: 10.0}  # micro 2 is within 2% of micro 4 (inside the noise); micro 1 is half as fast

    def probe(config):
        k = config.knobs
        return ProbeResult(
            status="ok",
            samples_per_s=speed[k.micro_batch_size],
            tokens_per_s=speed[k.micro_batch_size] * k.max_length,
            ranks=[RankMemory(rank=0, peak_allocated=10 * MiB, capacity=CAPACITY)],
            capacity=CAPACITY,
            wall_s=5.0,
            setup_s=1.0,
        )

    def confirmed(max_finalists):
        s = make(
            {**SMALL, "micro_batch_size": [1, 2, 4]},
            n_trials=3,
            schedule=Schedule(finalists=1, max_finalists=max_finalists),
        )
        out = []
        while (p := s.propose(None)) is not None:
            s.observe(p, probe(p.config))
            if p.fidelity == "confirm":
                out.append(p.config.knobs.micro_batch_size)
        return out

    assert confirmed(max_finalists=3) == [4, 2]  # the contender, never the config half as fast
    assert confirmed(max_finalists=1) == [4]
