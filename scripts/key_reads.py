"""Counts string-key reads in source (issue 20: records are typed, not dicts): every ``x["literal"]`` read (a
subscript with a string constant, not an assignment target) and every ``x.get("literal")`` call, per file.

    .venv/bin/python scripts/key_reads.py [--all] [DIR ...]   (default: tuner api trials; --all lists every file)

Environment lookups (``os.environ[...]``, ``env[...]``) count too: the number is an upper bound on record-field
reads, meant to be compared before and after a change, not read as zero-or-not."""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path


def reads(tree: ast.AST) -> int:
    count = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            key = node.slice
            count += isinstance(key, ast.Constant) and isinstance(key.value, str)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            first = node.args[0] if node.args else None
            count += isinstance(first, ast.Constant) and isinstance(first.value, str)
    return count


def main(argv: list[str]) -> int:
    show_all = "--all" in argv
    roots = [a for a in argv if a != "--all"] or ["tuner", "api", "trials"]
    per_file: Counter[str] = Counter()
    for root in roots:
        for path in sorted(Path(root).rglob("*.py")):
            n = reads(ast.parse(path.read_text(), str(path)))
            if n:
                per_file[str(path)] = n
    for name, n in per_file.most_common(None if show_all else 15):
        print(f"{n:5d}  {name}")
    print(f"{sum(per_file.values()):5d}  total in {len(per_file)} files")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
