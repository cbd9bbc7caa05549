"""JSON as a person reads a config: one line per top-level key, a nested object or list on one line when it fits.

`json.dumps(indent=2)` gives a 14-key DeepSpeed JSON 35 lines (every bucket size of ``zero_optimization`` on its
own line); this layout gives it about 15, within ``width`` columns, and ``json.loads`` reads it back the same.
"""

from __future__ import annotations

import json
from typing import Any

INDENT = "  "


def dumps(value: Any, width: int = 100) -> str:
    """``value`` as JSON text (ending in a newline): a top-level object one key per line; below it, any object or list
    whose one-line form fits in ``width`` columns at its place stays on one line, others open up the same way."""
    return _render(value, 0, 0, width, top=True) + "\n"


def _render(value: Any, depth: int, column: int, width: int, top: bool = False) -> str:
    flat = json.dumps(value, separators=(", ", ": "))
    if not isinstance(value, dict | list) or not value or (not top and column + len(flat) <= width):
        return flat
    pad, inner = INDENT * depth, INDENT * (depth + 1)
    if isinstance(value, dict):
        items = []
        for key, item in value.items():
            head = f"{inner}{json.dumps(str(key))}: "
            items.append(head + _render(item, depth + 1, len(head) + 1, width))  # + 1: the comma after it
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    rows = [inner + _render(item, depth + 1, len(inner) + 1, width) for item in value]
    return "[\n" + ",\n".join(rows) + "\n" + pad + "]"
