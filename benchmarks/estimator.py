"""The memory estimator's accuracy on the recorded tables: the uncalibrated estimate (tuner.memory.estimator, plus the
recording's tracker artifacts, benchmarks.replay.tracker_artifacts) against every measured peak, and the online
calibrated one (each peak predicted from the peaks measured before it, in grid order).

``PYTHONPATH=. python -m benchmarks.estimator benchmarks/tables/*.json`` prints the Markdown table BENCHMARKS.md
holds; ``--phases`` a second table, per recorded phase (train, eval forward, generate; a table whose grid evaluates
records all three). Pure arithmetic on the recorded traces: no torch, seconds.
"""

from __future__ import annotations

import argparse

from benchmarks.replay import estimator_error, phase_errors
from benchmarks.table import Table


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.estimator", description=__doc__.splitlines()[0])
    ap.add_argument("tables", nargs="+", help="recorded tables (benchmarks/tables/*.json)")
    ap.add_argument("--phases", action="store_true", help="also the errors per recorded phase")
    args = ap.parse_args(argv)
    print("| table | ok probes | median error | max error | within 10% | online-calibrated median / max |")
    print("|---|---:|---:|---:|---:|---:|")
    for path in args.tables:
        table = Table.load(path)
        r = estimator_error(table)
        if r is None:
            print(f"| {table.name} | no trace or no ok probe | | | | |")
            continue
        online = (
            f"{100 * r['online_median_abs']:.1f}% / {100 * r['online_max_abs']:.1f}%"
            if r["online_median_abs"] is not None
            else "-"
        )
        print(
            f"| {table.name} | {r['n']} | {100 * r['median_abs']:.1f}% | {100 * r['max_abs']:.1f}% | "
            f"{100 * r['within_10pct']:.0f}% | {online} |"
        )
    if args.phases:
        print()
        print(
            "| table | precision | train: n, median / max | eval forward: n, median / max | generate: n, median / max |"
        )
        print("|---|---|---|---|---|")
        for path in args.tables:
            table = Table.load(path)
            per = phase_errors(table)
            precisions = ", ".join(sorted({e.knobs.precision for e in table.entries.values()}))
            cells = [
                f"{per[p]['n']}, {100 * per[p]['median_abs']:.1f}% / {100 * per[p]['max_abs']:.1f}%"
                if p in per
                else "-"
                for p in ("train", "eval_forward", "generate")
            ]
            print(f"| {table.name} | {precisions} | {' | '.join(cells)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
