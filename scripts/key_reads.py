"""Counts string-key reads in source (issue 20: records are typed, not dicts): every ``x["literal"]`` read (a
subscript with a string constant, not an assignment target) and every ``x.get("literal")`` call, per file.

    .venv/bin/python scripts/key_reads.py [--all] [DIR ...]   (default: tuner api trials; --all lists every file)

Reads inside the one conversion of a stored record into a typed one (functions named ``from_record``,
``from_json``, ``from_dict``, ``from_cause``) are counted apart: that is where reading keys belongs. Environment
lookups and the user's own DeepSpeed / training-args JSON (tuner/interop) count too: the number is an upper bound on
record-field reads, meant to be compared before and after a change, not read as zero-or-not."""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

CONVERSIONS = frozenset({"from_record", "from_json", "from_dict", "from_cause"})


def _is_read(node: ast.AST) -> bool:
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
        return isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
        first = node.args[0] if node.args else None
        return isinstance(first, ast.Constant) and isinstance(first.value, str)
    return False


def reads(tree: ast.AST) -> tuple[int, int]:
    """(reads outside the record conversions, reads inside them)."""
    inside = 0
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.name in CONVERSIONS:
            inside += sum(_is_read(node) for node in ast.walk(fn))
    total = sum(_is_read(node) for node in ast.walk(tree))
    return total - inside, inside


def main(argv: list[str]) -> int:
    show_all = "--all" in argv
    roots = [a for a in argv if a != "--all"] or ["tuner", "api", "trials"]
    per_file: Counter[str] = Counter()
    converting = 0
    for root in roots:
        for path in sorted(Path(root).rglob("*.py")):
            n, inside = reads(ast.parse(path.read_text(), str(path)))
            converting += inside
            if n:
                per_file[str(path)] = n
    for name, n in per_file.most_common(None if show_all else 15):
        print(f"{n:5d}  {name}")
    print(f"{sum(per_file.values()):5d}  total in {len(per_file)} files ({converting} more inside record conversions)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
