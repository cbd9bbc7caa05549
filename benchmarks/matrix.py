"""The table x variant x strategy summary of one or more replay JSON files (``benchmarks.replay --json``), merged: the
same tables replayed with the same seeds by disjoint ``--strategies`` subsets read as one run.

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
    """Per table: the results (and held-out results) of every run; the runs must agree on seeds and table."""
    out: dict[str, Any] = {}
    for run in runs:
        for name, data in run.items():
            into = out.setdefault(name, {**data, "results": {}, **({"heldout": {}} if "heldout" in data else {})})
            if into["table"]["grid_seconds"] != data["table"]["grid_seconds"]:
                raise ValueError(f"{name}: the runs replayed different tables")
            for part in ("results", "heldout"):
                if part in data:
                    seeds = {r["runs"] for r in [*into.get(part, {}).values(), *data[part].values()]}
                    if len(seeds) > 1:
                        raise ValueError(f"{name}: the runs replayed different numbers of seeds ({sorted(seeds)})")
                    into.setdefault(part, {}).update(data[part])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.matrix", description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="JSON files written by benchmarks.replay --json")
    args = ap.parse_args(argv)
    try:
        merged = merge([json.loads(p.read_text()) for p in args.runs])
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: cannot merge the replay files: {exc}", file=sys.stderr)
        return 2
    print(matrix(merged, all("heldout" in d for d in merged.values())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
