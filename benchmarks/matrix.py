"""The table x variant x strategy summary of one or more replay JSON files (``benchmarks.replay --json``), merged: the
same tables replayed by disjoint ``--strategies`` subsets read as one run (a strategy replayed on fewer seeds is named
with its seed counts).

    .venv/bin/python -m benchmarks.matrix ours.json peers.json > matrix.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from benchmarks.replay import matrix


def merge(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per table: the results (and held-out results) of every run; the runs must have replayed the same table."""
    out: dict[str, Any] = {}
    for run in runs:
        for name, data in run.items():
            into = out.setdefault(name, {**data, "results": {}, **({"heldout": {}} if "heldout" in data else {})})
            if into["table"]["grid_seconds"] != data["table"]["grid_seconds"]:
                raise ValueError(f"{name}: the runs replayed different tables")
            for part in ("results", "heldout"):
                if part in data:  # each strategy's results carry their own number of runs (pivot names it)
                    into.setdefault(part, {}).update(data[part])
    return out


def pivot(merged: dict[str, Any]) -> str:
    """One line per table x variant, one column per strategy: probe-seconds to 1% of the best as % of the grid's
    (seeds of ``results`` / held-out seeds), then the strategies whose final pick was unstable in some run, and in how
    many."""
    strategies: list[str] = []
    for data in merged.values():
        strategies += [s for s in data["results"] if s not in strategies]
    first: dict[str, Any] = next(iter(merged.values()), {"results": {}})
    usual = max((r["runs"] for r in first["results"].values()), default=0)

    def title(strat: str) -> str:
        runs = {d["results"][strat]["runs"] for d in merged.values() if strat in d["results"]}
        held = {d["heldout"][strat]["runs"] for d in merged.values() if strat in d.get("heldout", {})}
        if runs == {usual}:
            return strat
        return (
            f"{strat} ({'/'.join(map(str, sorted(runs)))}"
            + (f" + {'/'.join(map(str, sorted(held)))}" if held else "")
            + " seeds)"
        )

    head = "| table | variant | device / rank | " + " | ".join(map(title, strategies)) + " | unstable picks (runs) |"
    lines = [head, "|---|---|---:|" + "---:|" * len(strategies) + "---:|"]

    def pct(r: dict[str, Any] | None) -> str:
        if r is None:
            return "-"
        return "never" if r["to_1pct_frac"] is None else f"{100 * r['to_1pct_frac']:.0f}%"

    for data in merged.values():
        info = data["table"]
        name, _, var = info["name"].partition("@")
        cells, unstable = [], []
        for strat in strategies:
            r, h = data["results"].get(strat), data.get("heldout", {}).get(strat)
            cells.append(pct(r) + (f" / {pct(h)}" if h is not None else ""))
            n = sum(x["unstable_picks"] for x in (r, h) if x is not None)
            runs = sum(x["runs"] for x in (r, h) if x is not None)
            if n:
                unstable.append(f"{strat} {n}/{runs}")
        lines.append(
            f"| {name} | {var or 'full'} | {info['device_memory'] / 2**20:.1f} MiB | "
            + " | ".join(cells)
            + f" | {', '.join(unstable) or 'none'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.matrix", description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="JSON files written by benchmarks.replay --json")
    ap.add_argument("--pivot", action="store_true", help="one line per table x variant, one column per strategy")
    args = ap.parse_args(argv)
    try:
        merged = merge([json.loads(p.read_text()) for p in args.runs])
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: cannot merge the replay files: {exc}", file=sys.stderr)
        return 2
    print(pivot(merged) if args.pivot else matrix(merged, all("heldout" in d for d in merged.values())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
