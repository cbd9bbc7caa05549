"""The import graph of tuner/, api/ and trials/, read statically (ast): every import statement of every module,
those inside functions and ``if TYPE_CHECKING:`` blocks too, since each is an arrow a reader follows.

- No import circle among our own modules (tuner.storage.db <-> tuner.storage.migrations was one: the developer-only
  revision() now lives in scripts/new_migration.py).
- Arrows point one way: storage, memory, api, cli (but the search command) and reporting import no tuner.search
  module (docs: /work/shared/DESIGN.md "Layout and dependency direction")."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("tuner", "api", "trials")
# Layers below the search (or beside it) that must not import it.
NO_SEARCH = ("tuner.storage", "tuner.memory", "api", "tuner.cli", "tuner.reporting", "tuner.records")
SEARCH_FACES = {"tuner.cli.search"}  # the CLI's search command renders the search: it may read its events
# Imports of tuner.search tolerated for now: none (issue 20's records branch removed the last three).
PENDING: dict[str, set[str]] = {}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations/versions" not in path.as_posix():
                found[_module_name(path)] = path
    return found


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The deepest of our modules that ``name`` (a dotted import target) names, or None for a third-party one."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Our modules that ``module`` imports (each ``from a.b import c`` is a.b.c when that is a module, else a.b)."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" for alias in node.names]
        for target in targets:
            found = _resolve(target, known)
            if found is not None and found != module:
                out.add(found)
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def _reach(edges: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = list(edges.get(start, ()))
    while todo:
        v = todo.pop()
        if v not in seen:
            seen.add(v)
            todo.extend(edges.get(v, ()))
    return seen


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: groups of modules that each reach the others (each sorted; a few hundred modules, so
    reachability from each is cheap)."""
    reach = {v: _reach(edges, v) for v in edges}
    groups = {tuple(sorted({v} | {w for w in reach[v] if v in reach.get(w, ())})) for v in edges if v in reach[v]}
    return sorted(list(g) for g in groups)


def test_the_graph_reads_every_module():
    edges = graph()
    assert {"tuner.storage.db", "tuner.storage.migrations", "api.app", "trials.contract"} <= set(edges)
    assert "tuner.storage.schema" in edges["tuner.storage.db"]


def test_the_cycle_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle():
    assert cycles(graph()) == []


def _below_search(module: str) -> bool:
    if module in SEARCH_FACES:
        return False
    return any(module == layer or module.startswith(layer + ".") for layer in NO_SEARCH)


def _into_search(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    found = {
        module: {t for t in targets if t == "tuner.search" or t.startswith("tuner.search.")}
        for module, targets in edges.items()
        if _below_search(module)
    }
    return {m: t for m, t in found.items() if t}


def test_no_arrow_runs_back_up_into_the_search():
    offenders = _into_search(graph())
    assert {m: t - PENDING.get(m, set()) for m, t in offenders.items() if t - PENDING.get(m, set())} == {}


def test_the_layer_check_sees_an_arrow_up():
    edges = {"tuner.memory.x": {"tuner.search.request"}, "tuner.cli.search": {"tuner.search.strategy"}}
    assert _into_search(edges) == {"tuner.memory.x": {"tuner.search.request"}}


def test_the_api_holds_no_sql():
    """The API reads through tuner.storage (Store, ReadStore, TrialReads): no SQLAlchemy, no Optuna storage
    internals, no connection of its own."""
    known = modules()
    for name, path in known.items():
        if name == "api" or name.startswith("api."):
            tree = ast.parse(path.read_text(), str(path))
            third_party = {
                alias.name if isinstance(node, ast.Import) else (node.module or "")
                for node in ast.walk(tree)
                if isinstance(node, ast.Import | ast.ImportFrom)
                for alias in node.names
            }
            assert not {m for m in third_party if m.split(".")[0] == "sqlalchemy" or m.startswith("optuna.storages")}, (
                name
            )
            assert ".connect(" not in path.read_text(), name
