"""Which config to probe next: a throughput model of the measured probes, and constrained expected improvement.

After the opening bisection, the search asks this module for the next config instead of TPE. The model is
tuner.search.regression's Bayesian linear regression of log(objective) on the knobs, fitted to every measured probe.
A measured probe teaches the model even when it ran above the headroom: its speed is real, only its memory is not
shippable.

Each unprobed config that the frontier does not rule out is scored by expected improvement over the best stable
objective measured so far, times the probability that it is stable: from the memory estimate (calibrated peak vs the
headroom line, with the estimator's relative error) when there is one, else a flat prior; the frontier's "fits"
verdict makes it 1. That is constrained EI (Gardner et al., ICML 2014); ties go to the cheaper probe.

Pure: numpy only, no database, no Optuna. tuner.search.proposers.guided calls :func:`guide_step`, which gathers what
the probe rows, the frontier and the estimate say and asks :func:`next_config`."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from trials.contract import BUCKET_KNOBS, Knobs
from tuner.memory.frontier import Frontier
from tuner.records import ProbeRow, ProbeStatus
from tuner.search.regression import NOISE_FLOOR, SPEED_SLOPES, Featurizer, Model
from tuner.search.selection import candidates

PEAK_NOISE_FLOOR = 0.03  # the same for log peak memory: measured peaks are deterministic, only the model misfits
UNKNOWN_FIT = 0.6  # P(stable) of a config with no estimate and no frontier verdict
# prior mean per doubling (log units): memory grows with the micro batch and the length (the speed prior: regression)
PEAK_SLOPES = {"micro_batch_size": 0.5, "max_length": 0.5, "reduce_bucket_size": 0.3, "allgather_bucket_size": 0.3}
BUCKETS = BUCKET_KNOBS  # sizes, for the memory model (tuner.search.regression.Featurizer)
LOCALITY = 0.5  # score factor per knob (besides the micro batch) beyond the first that differs from the incumbent
MICRO_STEP = 0.5  # a doubling of the micro batch away from the incumbent, in knobs
ESTIMATE_ERROR = 0.05  # relative error of a calibrated memory estimate (measured: median 1-2%, max ~6%)


@dataclass(frozen=True)
class Choice:
    knobs: Knobs
    score: float  # expected improvement (in log throughput) x P(stable)
    mean: float  # predicted objective
    p_stable: float


def expected_improvement(mean: float, std: float, best: float) -> float:
    z = (mean - best) / std
    return (mean - best) * _cdf(z) + std * _pdf(z)


def p_stable(estimate: int | None, limit: float | None, frontier_verdict: str | None) -> float:
    """Probability that a config runs under the headroom line ``limit`` (bytes)."""
    if frontier_verdict == "fits":
        return 1.0
    if frontier_verdict == "oom":
        return 0.0
    if estimate is None or not limit:
        return UNKNOWN_FIT
    return _cdf((limit - estimate) / (ESTIMATE_ERROR * max(estimate, 1)))


class PeakModel:
    """P(stable) without a trace: the same regression on log(peak bytes) of the measured probes. Memory is mostly
    model states plus micro batch x per-sample activations, so a few peaks predict the rest of the space; a
    prediction's doubt (model + residual noise) widens the chance either way, so far extrapolations stay uncertain
    (the frontier then settles them with a cheap OOM probe). An OOM probe counts as a peak at the capacity, a lower
    bound of its need. Bucket sizes enter as log2 of the size (``BUCKETS``): DeepSpeed allocates whole buckets, so
    what an OOM at one size taught carries over to the larger ones. Needs two peaks."""

    def __init__(self, configs: Sequence[Knobs], peaks: Sequence[tuple[Knobs, float]], limit: float) -> None:
        self.limit = math.log(limit)
        featurize = Featurizer(configs, sizes=BUCKETS)
        self.model = Model.fit(featurize, peaks, PEAK_NOISE_FLOOR, PEAK_SLOPES) if len(peaks) >= 2 else None

    def __call__(self, knobs: Knobs) -> float:
        if self.model is None:
            return UNKNOWN_FIT
        mean, std = self.model.predict(knobs)
        return _cdf((self.limit - mean) / math.hypot(std, self.model.noise))


def next_config(
    grid: Iterable[Knobs],
    measured: Sequence[tuple[Knobs, float]],
    best: float | None,
    skip: Callable[[Knobs], bool],
    p_fit: Callable[[Knobs], float],
    cost: Callable[[Knobs], float] | None = None,
    around: Knobs | None = None,
) -> Choice | None:
    """The unprobed config of ``grid`` with the highest EI x P(stable).

    ``measured``: (knobs, objective) of every measured ok probe (stable or not); ``best``: the best stable objective so
    far (None: none yet, any finishing config improves); ``skip``: configs already probed or ruled out; ``p_fit``:
    P(stable) per config; ``cost``: expected probe seconds, only to break near-ties towards the cheaper probe;
    ``around``: the incumbent (best stable config): candidates differing from it in more than one knob besides the
    micro batch are ranked down by LOCALITY per extra knob (a trust region: the model is least reliable far from what
    it measured, and one-knob moves are what DeepSpeed's autotuner exploits). ``Choice.score`` stays the plain
    EI x P(stable), for the convergence test. None when there is no measurement to fit yet or no candidate is left."""
    candidates = [k for k in grid if not skip(k)]
    if not measured or not candidates:
        return None
    model = Model.fit(Featurizer([k for k, _ in measured] + candidates), measured, slopes=SPEED_SLOPES)
    incumbent = math.log(best) if best else None
    plainest = _plainest(candidates + [k for k, _ in measured])
    top: tuple[tuple[float, float], Choice] | None = None
    for knobs in candidates:
        p = p_fit(knobs)
        if p <= 0.0:
            continue
        mean, std = model.predict(knobs)
        std = math.hypot(std, model.noise / 2)  # a probe also reveals whether the model's noise is kind to it
        ei = expected_improvement(mean, std, incumbent) if incumbent is not None else math.exp(mean)
        score = ei * p
        local = LOCALITY ** max(_distance(knobs, around, plainest) - 1, 0) if around is not None else 1.0
        rank = (round(score * local, 6), -(cost(knobs) if cost else 0.0))
        if top is None or rank > top[0]:
            top = (rank, Choice(knobs, score, math.exp(mean), p))
    return top[1] if top else None


@dataclass
class Step:
    choice: Choice | None
    best: float | None  # the best stable objective so far (a lower confidence bound)
    ruled_out: list[Knobs] = field(default_factory=list)  # per setting, the smallest micro batch that must OOM


def guide_step(
    grid: Sequence[Knobs],
    rows: Sequence[ProbeRow],
    frontier: Frontier,
    estimate: Callable[[Knobs], int | None] | None,
    *,
    known: set[str],
    key: Callable[[Knobs], str],
    capacity: int,
    headroom: float,
    estimate_margin: float,
) -> Step:
    """One decision of the guide over the probe rows (the shape of tuner_probes rows): configs already known or that
    the frontier or the estimate (above ``estimate_margin`` x capacity) rule out are skipped, and the boundary of the
    ruled-out ones is returned for the record. ``estimate``: calibrated peak bytes per config, or None without a
    trace (P(stable) then comes from a PeakModel of the measured peaks)."""
    measured = [
        (Knobs.model_validate(r.knobs), float(r.objective))
        for r in rows
        if r.measured and r.status == ProbeStatus.OK and r.objective
    ]
    found = candidates(rows)
    best = max((c.objective for c in found), default=None)
    limit = headroom * capacity if capacity else None
    estimates: dict[str, int | None] = {}
    ruled_out: dict[str, Knobs] = {}

    def rule_out(k: Knobs) -> bool:
        setting = json.dumps({**k.model_dump(mode="json"), "micro_batch_size": None}, sort_keys=True)
        if setting not in ruled_out or k.micro_batch_size < ruled_out[setting].micro_batch_size:
            ruled_out[setting] = k
        return True

    def skip(k: Knobs) -> bool:
        if key(k) in known:
            return True
        if frontier.infer(k) == "oom":
            return rule_out(k)
        estimates[key(k)] = est = estimate(k) if estimate is not None else None
        if est is not None and capacity and est > estimate_margin * capacity:
            return rule_out(k)
        return False

    peaks = None
    if estimate is None and limit:  # no trace: learn the memory need from the measured peaks
        needs = [(Knobs.model_validate(r.knobs), need) for r in rows if r.measured and (need := _need(r, capacity))]
        peaks = PeakModel(grid, needs, limit)

    def p_fit(k: Knobs) -> float:
        verdict = frontier.infer(k)
        if peaks is not None and verdict is None:
            return peaks(k)
        return p_stable(estimates.get(key(k)), limit, verdict)

    incumbent = Knobs.model_validate(max(found, key=lambda c: c.objective).knobs) if found else None
    choice = next_config(
        grid, measured, best, skip, p_fit, cost=lambda k: k.micro_batch_size * k.max_length, around=incumbent
    )
    return Step(choice, best, list(ruled_out.values()))


def _need(row: ProbeRow, capacity: int) -> float | None:
    """Memory a measured row needed: its peak when it finished; when it ran out of memory, at least the capacity, or
    what the emulated device was asked for when it refused (live bytes + the allocation: a 763 MiB bucket on a 160 MiB
    device says much more than "over 160 MiB")."""
    if row.status == ProbeStatus.OK and row.peak_allocated:
        return float(row.peak_allocated)
    if row.status == ProbeStatus.OOM and capacity:
        refused = row.measurement.oom_need
        return float(max(int(row.peak_allocated or 0), capacity, refused))
    return None


def _distance(a: Knobs, b: Knobs, plainest: Mapping[str, object]) -> float:
    """How many knobs besides the micro batch differ, plus MICRO_STEP per doubling of the micro batch between them. A
    knob that does not apply to one of them (None: e.g. bucket sizes at ZeRO stage 0) counts as its plainest value
    (``plainest``: the smallest bucket), so switching ZeRO on with the smallest buckets is one move, not three."""
    da, db = a.model_dump(), b.model_dump()
    knobs = 0
    for name, va in da.items():
        if name == "micro_batch_size":
            continue
        vb = db.get(name)
        va = plainest.get(name) if va is None else va
        vb = plainest.get(name) if vb is None else vb
        knobs += va != vb
    return knobs + MICRO_STEP * abs(math.log2(a.micro_batch_size / b.micro_batch_size))


def _plainest(configs: Iterable[Knobs]) -> dict[str, int]:
    """The smallest value of each numeric knob that is sometimes unset (None), e.g. bucket sizes."""
    out: dict[str, int] = {}
    for k in configs:
        for name, value in k.model_dump().items():
            if isinstance(value, int) and not isinstance(value, bool) and (name not in out or value < out[name]):
                out[name] = value
    return out


def _pdf(z: float) -> float:
    return math.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)


def _cdf(z: float) -> float:
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2)))


__all__ = [
    "NOISE_FLOOR",
    "Choice",
    "Featurizer",
    "Model",
    "PeakModel",
    "Step",
    "expected_improvement",
    "guide_step",
    "next_config",
    "p_stable",
]
