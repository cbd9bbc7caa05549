"""Which config to hand the user: pure functions over stored probe rows (see tuner.storage.schema.probes).

Probe throughput is noisy: on a shared CPU two probes of one config differ by 20-40%, and a search that keeps the config
with the best single measurement hands over its luckiest draw, not its fastest config (the winner's curse). So stable
configs are ranked on what all the probes say about each of them: the throughput model of every measured probe
(tuner.search.regression) is the prior of a config's log throughput (its prediction, give or take the model's doubt and
``CONFIG_SPREAD`` for what the model misses), and the config's own measurements update it with the noise that repeat
probes of one config show (pooled, with a prior of ``REPEAT_NOISE``). With precise measurements (a GPU: repeats agree
within a few percent) a config's own numbers decide; with noisy ones, the neighbours' evidence counts too. The rank is
that posterior's mean minus one standard deviation; ``Candidate.objective`` stays the measured throughput."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable

from trials.contract import Knobs
from tuner.records.candidate import Candidate
from tuner.records.probe import Fidelity, ProbeRow, ProbeStatus, baseline_row, failed_in_production
from tuner.search.regression import SPEED_SLOPES, Featurizer, Model

CONFIG_SPREAD = 0.05  # prior std of a config's log throughput around the model's prediction (what the model misses)
REPEAT_NOISE = 0.05  # prior guess of the std of log throughput between repeat probes of one config
REPEAT_NOISE_WEIGHT = 1.0  # ... worth this many repeat pairs, until measured repeats outweigh it


def candidates(rows: Iterable[ProbeRow]) -> list[Candidate]:
    """Stable configs, one per config key, best first: confirmed (re-probed longer) first, then by ``score``. A config
    with any unstable measurement, or whose production run failed, is excluded."""
    rows = list(rows)
    failed = failed_in_production(rows)
    by_key: dict[str, list[ProbeRow]] = {}
    for row in rows:
        if row.measured and row.config_key not in failed:
            by_key.setdefault(row.config_key, []).append(row)
    measured = {
        key: [
            math.log(r.objective)
            for r in group
            if r.status == ProbeStatus.OK and r.objective is not None and r.objective > 0
        ]
        for key, group in by_key.items()
    }
    stable = {key: group for key, group in by_key.items() if all(r.stable for r in group) and measured[key]}
    scores = _scores(stable, by_key, measured)
    out: list[Candidate] = []
    for key, group in stable.items():
        objs = [float(r.objective) for r in group if r.objective is not None]
        lcb = statistics.median(objs)
        if len(objs) > 1:
            lcb = min(lcb, statistics.fmean(objs) - statistics.stdev(objs))
        confirmed = any(r.fidelity == Fidelity.CONFIRM for r in group)
        first = min(group, key=lambda r: r.id or 0)
        out.append(
            Candidate(
                config_key=key,
                knobs=dict(first.knobs),
                config=dict(first.config),
                objective=lcb,
                samples_per_s=statistics.median(float(r.samples_per_s or 0.0) for r in group),
                peak_allocated=max(int(r.peak_allocated or 0) for r in group),
                capacity=first.capacity,
                confirmed=confirmed,
                measurements=len(objs),
                trial_number=first.trial_number,
                rows=group,
                score=scores[key][0],
                upper=scores[key][1],
            )
        )
    out.sort(key=lambda c: (c.confirmed, c.score), reverse=True)
    return out


def _scores(
    stable: dict[str, list[ProbeRow]], groups: dict[str, list[ProbeRow]], measured: dict[str, list[float]]
) -> dict[str, tuple[float, float]]:
    """Per stable config, the posterior mean -/+ one std of its log throughput (see the module docstring)."""
    noise2 = repeat_noise(measured.values()) ** 2
    knobs = {key: Knobs.model_validate(group[0].knobs) for key, group in groups.items() if measured[key]}
    model = None
    if len(stable) > 1:  # one config: nothing to compare, its own measurements are the score
        fitted = [(knobs[key], math.exp(y)) for key in knobs for y in measured[key]]
        model = Model.fit(Featurizer(list(knobs.values())), fitted, slopes=SPEED_SLOPES)
    out: dict[str, tuple[float, float]] = {}
    for key in stable:
        ys = measured[key]
        if model is None:
            mean, sd = statistics.fmean(ys), math.sqrt(noise2 / len(ys))
            out[key] = (mean - sd, mean + sd)
            continue
        mean, std = model.predict(knobs[key])
        prior = std * std + CONFIG_SPREAD**2
        precision = 1.0 / prior + len(ys) / noise2
        post = (mean / prior + sum(ys) / noise2) / precision
        sd = math.sqrt(1.0 / precision)
        out[key] = (post - sd, post + sd)
    return out


def repeat_noise(measured: Iterable[list[float]]) -> float:
    """Std of log throughput between repeat probes of one config: pooled over the configs measured more than once,
    shrunk towards REPEAT_NOISE while there are few repeats."""
    ss, dof = 0.0, 0
    for ys in measured:
        if len(ys) > 1:
            mean = statistics.fmean(ys)
            ss += sum((y - mean) ** 2 for y in ys)
            dof += len(ys) - 1
    return math.sqrt((REPEAT_NOISE_WEIGHT * REPEAT_NOISE**2 + ss) / (REPEAT_NOISE_WEIGHT + dof))


def best_stable(rows: Iterable[ProbeRow]) -> Candidate | None:
    """The best stable config: confirmed ones (re-probed longer) win over unconfirmed; then the higher objective."""
    found = candidates(rows)
    return found[0] if found else None


__all__ = ["baseline_row", "best_stable", "candidates", "failed_in_production", "repeat_noise"]
