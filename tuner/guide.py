"""Which config to probe next: a throughput model of the measured probes, and constrained expected improvement.

After the opening bisection, the search asks this module for the next config instead of TPE. The model is Bayesian
linear regression of log(objective) on the knobs — quadratic in log2(micro batch) and log2(max_length) with their
interaction (throughput saturates with the batch, longer sequences cost more per token), one-hot for every other knob
that varies in the space (ZeRO stage, checkpointing, overlap_comm, buckets, offload, precision ...): the knob effects
are mostly multiplicative, so few probes pin them down (the step-time model of Pollux, OSDI'21, fitted per knob).
A measured probe teaches the model even when it ran above the headroom: its speed is real, only its memory is not
shippable.

Each unprobed config that the frontier does not rule out is scored by expected improvement over the best stable
objective measured so far, times the probability that it is stable: from the memory estimate (calibrated peak vs the
headroom line, with the estimator's relative error) when there is one, else a flat prior; the frontier's "fits"
verdict makes it 1. That is constrained EI (Gardner et al., ICML 2014); ties go to the cheaper probe.

Pure: numpy only, no database, no Optuna. tuner.strategy.Strategy calls :func:`guide_step`, which gathers what the
probe rows, the frontier and the estimate say and asks :func:`next_config`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from trials.contract import Knobs
from tuner.frontier import Frontier
from tuner.selection import MEASURED, candidates

NUMERIC = ("micro_batch_size", "max_length")
PRIOR_SCALE = 0.5  # prior std of a first-order effect on log throughput: a knob level, or a doubling (e^0.5 = 1.65x)
OFFSET_SCALE = 3.0  # prior std of the offset from the mean measured log throughput (nearly flat)
CURVATURE_SCALE = 0.15  # prior std of the quadratic and interaction terms (per doubling squared)
NOISE_FLOOR = 0.1  # the smallest noise std assumed on log throughput (probes of a few steps are noisy)
PEAK_NOISE_FLOOR = 0.03  # the same for log peak memory: measured peaks are deterministic, only the model misfits
UNKNOWN_FIT = 0.6  # P(stable) of a config with no estimate and no frontier verdict
# prior means per doubling (log units): a larger micro batch amortizes the per-step overhead (what every batch-size
# finder bets on), and memory grows with the micro batch and the length; the data can overrule both
SPEED_SLOPES = {"micro_batch_size": 0.15}
PEAK_SLOPES = {"micro_batch_size": 0.5, "max_length": 0.5}
LOCALITY = 0.5  # score factor per knob (besides the micro batch) beyond the first that differs from the incumbent
MICRO_STEP = 0.5  # a doubling of the micro batch away from the incumbent, in knobs
ESTIMATE_ERROR = 0.05  # relative error of a calibrated memory estimate (measured: median 1-2%, max ~6%)


@dataclass(frozen=True)
class Choice:
    knobs: Knobs
    score: float  # expected improvement (in log throughput) x P(stable)
    mean: float  # predicted objective
    p_stable: float


class Featurizer:
    """Knobs -> feature vector over the knobs that vary among ``configs``."""

    def __init__(self, configs: Sequence[Knobs]) -> None:
        dumps = [k.model_dump(mode="json") for k in configs]
        names = sorted(dumps[0]) if dumps else []
        self.numeric = [n for n in NUMERIC if len({d[n] for d in dumps}) > 1]
        self.levels: dict[str, list[str]] = {}
        for name in names:
            if name in NUMERIC:
                continue
            values = sorted({repr(d.get(name)) for d in dumps})
            if len(values) > 1:
                self.levels[name] = values[1:]  # dummy coding: the first level is the baseline
        self.center = {n: float(np.mean([math.log2(d[n]) for d in dumps])) for n in self.numeric}

    def prior_scales(self) -> np.ndarray:
        """Prior std per feature, in the order of ``__call__``."""
        n = len(self.numeric)
        second = n + (1 if n == 2 else 0)
        onehots = sum(len(v) for v in self.levels.values())
        return np.asarray([OFFSET_SCALE] + [PRIOR_SCALE] * n + [CURVATURE_SCALE] * second + [PRIOR_SCALE] * onehots,
                          dtype=float)

    def prior_means(self, slopes: dict[str, float]) -> np.ndarray:
        """Prior mean per feature: zero, except the first-order term of the numeric knobs named in ``slopes``."""
        mean = np.zeros(len(self.prior_scales()))
        for i, name in enumerate(self.numeric):
            mean[1 + i] = slopes.get(name, 0.0)
        return mean

    def __call__(self, knobs: Knobs) -> np.ndarray:
        d = knobs.model_dump(mode="json")
        out: list[float] = [1.0]  # the offset from the mean of the measurements
        logs = [math.log2(d[n]) - self.center[n] for n in self.numeric]
        out.extend(logs)
        out.extend(x * x for x in logs)
        if len(logs) == 2:
            out.append(logs[0] * logs[1])
        for name, levels in self.levels.items():
            value = repr(d.get(name))
            out.extend(1.0 if value == level else 0.0 for level in levels)
        return np.asarray(out, dtype=float)


@dataclass
class Model:
    """Bayesian linear regression (Gaussian prior per coefficient, Featurizer.prior_scales; intercept = mean of y)."""

    featurize: Featurizer
    mean_w: np.ndarray
    cov_w: np.ndarray
    intercept: float
    noise: float

    @classmethod
    def fit(cls, featurize: Featurizer, measured: Sequence[tuple[Knobs, float]], floor: float = NOISE_FLOOR,
            slopes: dict[str, float] | None = None) -> Model:
        """``slopes``: prior mean of the first-order effect of a doubling of a numeric knob (default none)."""
        x = np.stack([featurize(k) for k, _ in measured])
        y = np.log(np.asarray([v for _, v in measured], dtype=float))
        intercept = float(y.mean())
        yc = y - intercept
        noise = floor
        prior = np.diag(1.0 / featurize.prior_scales() ** 2)
        prior_mean = featurize.prior_means(slopes or {})
        for _ in range(2):  # estimate the noise from the residuals, never below the floor
            precision = x.T @ x / noise**2 + prior
            cov = np.linalg.inv(precision)
            w = cov @ (x.T @ yc / noise**2 + prior @ prior_mean)
            used = float(np.trace(x @ cov @ x.T)) / noise**2  # effective number of parameters the data pinned down
            dof = max(len(y) - used, 1.0)
            noise = max(floor, float(np.sqrt(np.sum((yc - x @ w) ** 2) / dof)))
        return cls(featurize, w, cov, intercept, noise)

    def predict(self, knobs: Knobs) -> tuple[float, float]:
        """Mean and std of log(objective) (the std of the mean, without the probe noise)."""
        f = self.featurize(knobs)
        return self.intercept + float(f @ self.mean_w), float(np.sqrt(max(f @ self.cov_w @ f, 1e-12)))


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
    bound of its need. Needs two peaks."""

    def __init__(self, configs: Sequence[Knobs], peaks: Sequence[tuple[Knobs, float]], limit: float) -> None:
        self.limit = math.log(limit)
        self.model = Model.fit(Featurizer(configs), peaks, PEAK_NOISE_FLOOR, PEAK_SLOPES) if len(peaks) >= 2 else None

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
    rows: Sequence[dict[str, Any]],
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
    measured = [(Knobs.model_validate(r["knobs"]), float(r["objective"])) for r in rows
                if r.get("fidelity") in MEASURED and r.get("status") == "ok" and r.get("objective")]
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
        needs = [(Knobs.model_validate(r["knobs"]), need) for r in rows
                 if r.get("fidelity") in MEASURED and (need := _need(r, capacity))]
        peaks = PeakModel(grid, needs, limit)

    def p_fit(k: Knobs) -> float:
        verdict = frontier.infer(k)
        if peaks is not None and verdict is None:
            return peaks(k)
        return p_stable(estimates.get(key(k)), limit, verdict)

    incumbent = Knobs.model_validate(max(found, key=lambda c: c.objective).knobs) if found else None
    choice = next_config(grid, measured, best, skip, p_fit, cost=lambda k: k.micro_batch_size * k.max_length,
                         around=incumbent)
    return Step(choice, best, list(ruled_out.values()))


def _need(row: dict[str, Any], capacity: int) -> float | None:
    """Memory a measured row needed: its peak when it finished; at least the capacity when it ran out of memory."""
    if row.get("status") == "ok" and row.get("peak_allocated"):
        return float(row["peak_allocated"])
    if row.get("status") == "oom" and capacity:
        return float(max(int(row.get("peak_allocated") or 0), capacity))
    return None


def _distance(a: Knobs, b: Knobs, plainest: dict[str, object]) -> float:
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


def _plainest(configs: Iterable[Knobs]) -> dict[str, object]:
    """The smallest value of each numeric knob that is sometimes unset (None), e.g. bucket sizes."""
    out: dict[str, object] = {}
    for k in configs:
        for name, value in k.model_dump().items():
            if isinstance(value, int) and not isinstance(value, bool) and (name not in out or value < out[name]):
                out[name] = value
    return out


def _pdf(z: float) -> float:
    return math.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)


def _cdf(z: float) -> float:
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2)))


__all__ = ["Choice", "Featurizer", "Model", "PeakModel", "Step", "expected_improvement", "guide_step", "next_config",
           "p_stable"]
