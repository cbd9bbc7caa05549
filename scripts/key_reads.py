"""Counts string-key reads in source (issue 20: records are typed, not dicts): every ``x["literal"]`` read (a
subscript with a string constant, not an assignment target) and every ``x.get("literal")`` call, per file.

    .venv/bin/python scripts/key_reads.py [--all] [--records] [DIR ...]
        (default: tuner api trials; --all lists every file; --records lists the record-field reads per file)

Two numbers. **Record-field reads**: reads whose key is the name of a field of a typed record of the records floor
(every dataclass in tuner.records: ProbeRow, StudyDefinition, SearchRun, Claim, Measurement, RankPeaks, RuledOutBy,
ProductionResult, Candidate ...), i.e. a record's field read out of a dict instead of off the record. The rule is by
key, so it needs no type inference: a read of the user's own documents (their DeepSpeed JSON, training args, dataset
rows), of HTTP bodies and of the environment counts only when it happens to use a record's field name; those are
listed with --records so a reader can tell them apart. **All string-key reads**: an upper bound, including the user's
DeepSpeed / training-args JSON in tuner/interop, environment lookups and the probe's own JSON in trials/. Both leave
out the one conversion of a stored record into a typed one (functions named ``from_record``, ``from_json``,
``from_dict``, ``from_cause``): that is where reading keys belongs; environment lookups (``os.environ[...]``,
``environ.get(...)``) are never record fields."""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

CONVERSIONS = frozenset({"from_record", "from_json", "from_dict", "from_cause"})


def record_fields() -> frozenset[str]:
    """The field names of every dataclass of the records floor (tuner.records and its modules)."""
    import dataclasses
    import importlib
    import pkgutil

    import tuner.records as floor

    names: set[str] = set()
    for info in pkgutil.iter_modules(floor.__path__):
        module = importlib.import_module(f"tuner.records.{info.name}")
        for value in vars(module).values():
            if isinstance(value, type) and dataclasses.is_dataclass(value) and value.__module__ == module.__name__:
                names.update(f.name for f in dataclasses.fields(value))
    return frozenset(names)


def _key(node: ast.AST) -> str | None:
    """The literal key of a read (``x["k"]`` loaded, ``x.get("k", ...)``), else None; None for the environment."""
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
        target, key = node.value, node.slice
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and node.args:
        target, key = node.func.value, node.args[0]
    else:
        return None
    if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
        return None
    return key.value if not _environ(target) else ""


def _environ(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
        isinstance(node, ast.Name) and node.id == "environ"
    )


def _is_read(node: ast.AST) -> bool:
    return _key(node) is not None


def _conversion_nodes(tree: ast.AST) -> set[int]:
    inside: set[int] = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.name in CONVERSIONS:
            inside.update(id(node) for node in ast.walk(fn))
    return inside


def reads(tree: ast.AST) -> tuple[int, int]:
    """(reads outside the record conversions, reads inside them)."""
    inside = _conversion_nodes(tree)
    found = [node for node in ast.walk(tree) if _is_read(node)]
    within = sum(id(node) in inside for node in found)
    return len(found) - within, within


def field_reads(tree: ast.AST, fields: frozenset[str]) -> list[tuple[int, str]]:
    """(line, key) of each read of a record field's name outside the record conversions and the environment."""
    inside = _conversion_nodes(tree)
    return sorted(
        (getattr(node, "lineno", 0), key)
        for node in ast.walk(tree)
        if id(node) not in inside and (key := _key(node)) and key in fields
    )


def main(argv: list[str]) -> int:
    show_all, show_records = "--all" in argv, "--records" in argv
    roots = [a for a in argv if not a.startswith("--")] or ["tuner", "api", "trials"]
    fields = record_fields()
    per_file: Counter[str] = Counter()
    records: dict[str, list[tuple[int, str]]] = {}
    converting = 0
    for root in roots:
        for path in sorted(Path(root).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            n, inside = reads(tree)
            converting += inside
            if n:
                per_file[str(path)] = n
            if found := field_reads(tree, fields):
                records[str(path)] = found
    for name, n in per_file.most_common(None if show_all else 15):
        print(f"{n:5d}  {name}")
    if show_records:
        for name, found in sorted(records.items()):
            print(f"{len(found):5d}  {name}: " + ", ".join(f"{line}:{key}" for line, key in found))
    n_records = sum(len(f) for f in records.values())
    print(
        f"{sum(per_file.values()):5d}  string-key reads in {len(per_file)} files ({converting} more inside conversions)"
    )
    print(f"{n_records:5d}  record-field reads in {len(records)} files (keys named as a tuner.records field)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
