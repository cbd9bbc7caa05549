"""Issue 20: the records are a floor below storage: they import nothing of tuner but themselves and tuner.errors (and
trials.contract). (That nothing below the search imports it is tests/test_import_graph.py's.)"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_the_records_import_only_themselves_the_errors_and_the_probe_contract() -> None:
    allowed = ("tuner.records", "tuner.errors", "trials.contract")
    for p in sorted((ROOT / "tuner/records").rglob("*.py")):
        ours = {m for m in _imports(p) if m.split(".")[0] in ("tuner", "trials", "api")}
        assert all(m.startswith(allowed) for m in ours), (p.name, ours)
