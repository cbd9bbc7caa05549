"""The CLI's console: rich's Console, except that the text it prints carries no control characters of its own.

Stored text (study names, causes, messages written by an older tuner or by hand) and user text may hold ESC
sequences, carriage returns or C1 codes that would move the cursor, recolour or rewrite the terminal. Every segment
rich renders passes ``safe_text`` (each such character becomes ``?``; newlines and tabs stay) before rich adds its own
styling, so whatever the renderable (a string, Text, a table cell), nothing stored reaches the terminal raw.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from rich.console import Console
from rich.segment import Segment

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def safe_text(text: str) -> str:
    """``text`` with every C0/C1 control character but newline and tab shown as ``?``."""
    return _CONTROL.sub("?", text)


class SafeConsole(Console):
    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        clean = (seg if seg.control else Segment(safe_text(seg.text), seg.style, seg.control) for seg in buffer)
        return super()._render_buffer(clean)


__all__ = ["SafeConsole", "safe_text"]
