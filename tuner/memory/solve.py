"""The largest length or micro batch that fits: a bisection over the one shared estimate (pure)."""

from __future__ import annotations

from collections.abc import Callable

from trials.contract import Knobs
from tuner.memory.estimator import Estimator


def fits(est: Estimator, knobs: Knobs, capacity: int, margin: float) -> bool:
    """The verdict `tuner estimate` prints: the calibrated peak with ``margin`` on top within ``capacity``."""
    return est.predict(knobs).calibrated * (1 + margin) <= capacity


def largest(ok: Callable[[int], bool], upper: int) -> int | None:
    """The largest n in [1, upper] with ``ok(n)``, ``ok`` monotone (true up to a point); None when ``ok(1)`` fails."""
    if not ok(1):
        return None
    lo, hi = 1, upper
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def max_length(est: Estimator, knobs: Knobs, capacity: int, margin: float, upper: int) -> int | None:
    """The longest max_length (<= ``upper``) that fits at the config's micro batch."""
    return largest(lambda n: fits(est, knobs.model_copy(update={"max_length": n}), capacity, margin), upper)


def max_micro_batch(est: Estimator, knobs: Knobs, capacity: int, margin: float, upper: int) -> int | None:
    """The largest micro batch (<= ``upper``) that fits at the config's length."""
    return largest(lambda n: fits(est, knobs.model_copy(update={"micro_batch_size": n}), capacity, margin), upper)
