"""A throughput (or memory) model of the measured probes: Bayesian linear regression of log(value) on the knobs.

Quadratic in log2(micro batch) and log2(max_length) with their interaction (throughput saturates with the batch, longer
sequences cost more per token), one-hot for every other knob that varies (ZeRO stage, checkpointing, overlap_comm,
buckets, offload, precision ...): the knob effects are mostly multiplicative, so few probes pin them down (the step-time
model of Pollux, OSDI'21, fitted per knob). Used by tuner.search.guide (which config to probe next) and
tuner.search.selection (which measured config to trust). Pure: numpy only."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from trials.contract import Knobs

NUMERIC = ("micro_batch_size", "max_length")
PRIOR_SCALE = 0.5  # prior std of a first-order effect on log throughput: a knob level, or a doubling (e^0.5 = 1.65x)
OFFSET_SCALE = 3.0  # prior std of the offset from the mean measured log throughput (nearly flat)
CURVATURE_SCALE = 0.15  # prior std of the quadratic and interaction terms (per doubling squared)
NOISE_FLOOR = 0.1  # the smallest noise std assumed on log throughput (probes of a few steps are noisy)
# prior mean per doubling of the micro batch (log units): a larger micro batch amortizes the per-step overhead (what
# every batch-size finder bets on); the data can overrule it
SPEED_SLOPES = {"micro_batch_size": 0.15, "gradient_checkpointing=True": -0.3}


class Featurizer:
    """Knobs -> feature vector over the knobs that vary among ``configs``. ``sizes``: knobs (bucket sizes) that enter
    as log2(value / smallest value), 0 where unset (ZeRO stage 0 has no buckets: the stage's own feature carries
    that), instead of one level each, so what one bucket size taught carries over to the others (memory)."""

    def __init__(self, configs: Sequence[Knobs], sizes: Sequence[str] = ()) -> None:
        dumps = [k.model_dump(mode="json") for k in configs]
        names = sorted(set().union(*dumps))  # an engine's own knobs are in its configs' dumps only (FSDP2's)
        self.numeric = [n for n in NUMERIC if len({d[n] for d in dumps}) > 1]
        self.sizes = {
            n: float(min(set_values)) for n in sizes if len(set_values := {d[n] for d in dumps if d.get(n)}) > 1
        }
        self.levels: dict[str, list[str]] = {}
        for name in names:
            if name in NUMERIC or name in self.sizes:
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
        return np.asarray(
            [OFFSET_SCALE]
            + [PRIOR_SCALE] * n
            + [CURVATURE_SCALE] * second
            + [PRIOR_SCALE] * len(self.sizes)
            + [PRIOR_SCALE] * onehots,
            dtype=float,
        )

    def prior_means(self, slopes: dict[str, float]) -> np.ndarray:
        """Prior mean per feature: zero, except the first-order term of the numeric and size knobs named in
        ``slopes``."""
        mean = np.zeros(len(self.prior_scales()))
        for i, name in enumerate(self.numeric):
            mean[1 + i] = slopes.get(name, 0.0)
        n = len(self.numeric)
        first_size = 1 + n + n + (1 if n == 2 else 0)
        for i, name in enumerate(self.sizes):
            mean[first_size + i] = slopes.get(name, 0.0)
        j = first_size + len(self.sizes)
        for name, levels in self.levels.items():
            for level in levels:
                mean[j] = slopes.get(f"{name}={level}", 0.0)
                j += 1
        return mean

    def __call__(self, knobs: Knobs) -> np.ndarray:
        d = knobs.model_dump(mode="json")
        out: list[float] = [1.0]  # the offset from the mean of the measurements
        logs = [math.log2(d[n]) - self.center[n] for n in self.numeric]
        out.extend(logs)
        out.extend(x * x for x in logs)
        if len(logs) == 2:
            out.append(logs[0] * logs[1])
        out.extend(math.log2(d[n] / smallest) if d.get(n) else 0.0 for n, smallest in self.sizes.items())
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
    def fit(
        cls,
        featurize: Featurizer,
        measured: Sequence[tuple[Knobs, float]],
        floor: float = NOISE_FLOOR,
        slopes: dict[str, float] | None = None,
    ) -> Model:
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


__all__ = ["NOISE_FLOOR", "SPEED_SLOPES", "Featurizer", "Model"]
