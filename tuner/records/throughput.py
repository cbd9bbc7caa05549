"""A config's throughput as every face shows it: one statistic, one rounding, one speed-up.

A config probed more than once has several measurements (a short probe, its confirmation, a repeat by another worker);
faces that each picked their own (the best single probe, the latest, a lower bound, the median) printed four numbers
for one pick. Every face — the search's summary, `tuner best --changes`, `tuner export`, the report, `tuner trials`,
`tuner studies`, ``GET /best-config`` and ``GET /studies/{name}``, the dashboard, ``tuner.best_config`` — now reads
``throughput`` of the config's probe rows: the **median of its probes** (ok and measured), in the study's objective unit
(samples/s, or retained tokens/s when the search varied max_length), and its samples/s median beside it. A speed-up is
the ratio of the two numbers printed beside it (``speedup`` divides the rounded figures ``number`` prints).

The ranking of candidates (tuner.search.selection) is not this: it ranks on a posterior lower bound, which is a
decision, not a measurement to show. Pure, no I/O."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from tuner.records.probe import ProbeRow, ProbeStatus

STATISTIC = "the median of its probes"  # said once per face, where the figure is first shown


def number(value: float | None) -> str:
    """The one rounding of a throughput: 1,234.5 / 80.1 / 5.00 / 0.123 ("-" for none)."""
    if value is None:
        return "-"
    return f"{value:,.1f}" if abs(value) >= 10 else f"{value:#.3g}"


def shown(value: float) -> float:
    """``value`` as ``number`` prints it (what a reader can divide)."""
    return float(number(value).replace(",", ""))


@dataclass(frozen=True)
class Throughput:
    """A config's measured throughput: the median over its ok probes of the objective and of samples/s."""

    value: float  # in the study's objective unit (samples/s, or retained tokens/s)
    samples_per_s: float
    probes: int  # how many measurements the median is of

    def text(self, unit: str) -> str:
        """'80.1 samples/s' (the figure every face prints)."""
        return f"{number(self.value)} {unit}"

    def statistic(self) -> str:
        """What the figure is, in words: 'one probe' or 'the median of its 3 probes'."""
        return "one probe" if self.probes == 1 else f"the median of its {self.probes} probes"


def throughput(rows: Iterable[ProbeRow]) -> Throughput | None:
    """The throughput of the rows of one config (its candidate's rows, or every row of its config key): the median of
    the ok measured probes' objective and samples/s; None when none has a measured objective."""
    ok = [r for r in rows if r.measured and r.status == ProbeStatus.OK and r.objective is not None]
    if not ok:
        return None
    return Throughput(
        value=float(statistics.median(float(r.objective or 0.0) for r in ok)),
        samples_per_s=float(statistics.median(float(r.samples_per_s or 0.0) for r in ok)),
        probes=len(ok),
    )


def config_throughput(rows: Iterable[ProbeRow], row: ProbeRow | None) -> Throughput | None:
    """The throughput of ``row``'s config among ``rows`` (every probe of the same config key): what the faces show for
    the user's own config beside the pick (``row``: the study's baseline row)."""
    if row is None:
        return None
    return throughput(r for r in rows if r.config_key == row.config_key) or throughput([row])


def speedup(pick: Throughput, base: Throughput | None) -> float | None:
    """The pick's figure over the baseline's, as printed (rounded as ``number`` rounds): None without a baseline
    figure (the baseline failed, or there is none)."""
    if base is None or shown(base.value) <= 0:
        return None
    return shown(pick.value) / shown(base.value)


def speedup_text(pick: Throughput, base: Throughput, unit: str) -> str:
    """'1.49x the throughput of your config (53.7 -> 80.1 samples/s)': the factor is the ratio of the two numbers."""
    factor = speedup(pick, base)
    head = f"{factor:.2f}x" if factor is not None else "-"
    return f"{head} the throughput of your config ({number(base.value)} -> {number(pick.value)} {unit})"


__all__ = ["STATISTIC", "Throughput", "config_throughput", "number", "shown", "speedup", "speedup_text", "throughput"]
