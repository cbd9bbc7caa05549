"""Issue 20: the records are a floor below storage. No arrow runs back up: storage, memory, the API, the CLI (but
`tuner search`'s command, which drives the session), reporting and the records themselves import no tuner.search
module; the records import nothing of tuner but themselves and tuner.errors (and trials.contract)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
BELOW_SEARCH = ("tuner/storage", "tuner/memory", "tuner/cli", "tuner/reporting", "tuner/records", "api")
# cli/search.py renders a search session; memory/tracing.py takes a SearchRequest until issue 20's other half
# (memory takes shapes) lands
EXEMPT = {"tuner/cli/search.py", "tuner/memory/tracing.py"}


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def _sources(*dirs: str) -> list[Path]:
    return [p for d in dirs for p in sorted((ROOT / d).rglob("*.py"))]


def test_nothing_below_the_search_imports_it() -> None:
    offenders = {
        str(p.relative_to(ROOT)): sorted(m for m in _imports(p) if m == "tuner.search" or m.startswith("tuner.search."))
        for p in _sources(*BELOW_SEARCH)
        if str(p.relative_to(ROOT)) not in EXEMPT
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_records_import_only_themselves_the_errors_and_the_probe_contract() -> None:
    allowed = ("tuner.records", "tuner.errors", "trials.contract")
    for p in _sources("tuner/records"):
        ours = {m for m in _imports(p) if m.split(".")[0] in ("tuner", "trials", "api")}
        assert all(m.startswith(allowed) for m in ours), (p.name, ours)
