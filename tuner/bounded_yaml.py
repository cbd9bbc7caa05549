"""YAML from a user's file (a space file, an accelerate config, a data folder's README) read within tuner.bounded's
bounds after its aliases are expanded (issue 42 §3, §4).

An alias costs a few bytes and stands for its whole anchor: a 1.06 MB accelerate config of one 1 MiB string referenced
3,000 times passed both the byte bound and the item bound, and ``json.dumps`` of it (the study definition) wrote past
4 GB. So the document's events are counted first, by libyaml (``yaml.CSafeLoader``; PyYAML's pure-Python loader
where libyaml is missing: it took 64 s and 1.45 GB on a plain 4 MiB file): every scalar's characters and every item,
an alias counting its anchor's whole size, and the nesting; past ``MAX_FILE_BYTES`` characters, ``MAX_ITEMS`` items or
``MAX_DEPTH`` levels, or an alias to a node that contains it, the document is refused before a Python object is
built; a mapping's key given twice is refused too (PyYAML keeps the last). Then it is built by the safe constructor,
whose errors (an integer of 5,000 digits, ``2001-13-45``, a bad ``!!binary``) are each one line, and a number that is
not finite (``.nan``, ``.inf``) is refused.
"""

from __future__ import annotations

from typing import Any

import yaml

from tuner.bounded import MAX_DEPTH, MAX_FILE_BYTES, MAX_ITEMS, ShapeError, check_shape, check_values
from tuner.errors import ConfigError, TunerError

Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser, the safe constructor
_SHOWN = 200  # characters of a parser's message echoed


def _problem(err: yaml.YAMLError) -> str:
    """The parser's problem and where, without the snippet of the user's line it quotes."""
    problem = getattr(err, "problem", None) or getattr(err, "context", None)
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    text = str(problem) if problem else str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    return (text if len(text) <= _SHOWN else f"{text[:_SHOWN]}...") + where


class _Count:
    """The expanded size of a document's events so far (scalar characters + items), its depth, its anchors' sizes."""

    def __init__(self, what: str, error: type[TunerError]) -> None:
        self.what = what
        self.error = error
        self.size = 0
        self.items = 0
        self.aliases = 0
        self.open: list[tuple[str | None, int, int]] = []  # (anchor, size, items) at each open collection's start
        self.anchors: dict[str, tuple[int, int]] = {}
        self.keys: list[tuple[set[tuple[str, object]], list[bool]] | None] = []  # each open mapping's keys so far

    def _node(self, event: Any) -> None:
        """A node in the open collection: a mapping's key is checked against its keys so far (PyYAML keeps the
        last of two; the user's reader may not: one line rather than a guess)."""
        mapping = self.keys[-1] if self.keys else None
        if mapping is None:
            return
        keys, expect = mapping
        if expect[0] and isinstance(event, yaml.ScalarEvent):
            key = (event.value, event.style)
            if key in keys:
                raise self.error(f"the {self.what} has the key {event.value[:80]!r} twice in one mapping; keep one")
            keys.add(key)
        expect[0] = not expect[0]

    def add(self, size: int, items: int) -> None:
        self.size += size
        self.items += items
        if self.size > MAX_FILE_BYTES:
            raise ShapeError(
                f"the {self.what} holds over {MAX_FILE_BYTES >> 20} MiB{self._expanded()}; a config holds a few KiB"
                + (" (write each value once, without YAML anchors and aliases)" if self.aliases else "")
            )
        if self.items > MAX_ITEMS:
            raise ShapeError(
                f"the {self.what} holds more than {MAX_ITEMS} keys and items{self._expanded()}; a config holds a few "
                "hundred"
            )

    def _expanded(self) -> str:
        return " once its aliases are expanded" if self.aliases else ""

    def event(self, event: Any) -> None:
        anchor = getattr(event, "anchor", None)
        if isinstance(event, (yaml.ScalarEvent, yaml.AliasEvent, yaml.CollectionStartEvent)):
            self._node(event)
        if isinstance(event, yaml.ScalarEvent):
            self.add(len(event.value) + 1, 1)
            if anchor is not None:
                self.anchors[anchor] = (len(event.value) + 1, 1)
        elif isinstance(event, yaml.AliasEvent):
            if anchor not in self.anchors:
                raise self.error(f"the {self.what} has an alias *{str(anchor)[:80]} to a node that contains it")
            self.aliases += 1
            self.add(*self.anchors[anchor])
        elif isinstance(event, yaml.CollectionStartEvent):
            if len(self.open) >= MAX_DEPTH:
                raise ShapeError(f"the {self.what} nests deeper than {MAX_DEPTH} levels")
            self.open.append((anchor, self.size, self.items))
            self.keys.append((set(), [True]) if isinstance(event, yaml.MappingStartEvent) else None)
            self.add(1, 1)
        elif isinstance(event, yaml.CollectionEndEvent):
            self.keys.pop()
            name, size, items = self.open.pop()
            if name is not None:
                self.anchors[name] = (self.size - size, self.items - items)


def _count(text: str, what: str, error: type[TunerError]) -> None:
    loader = Loader(text)
    try:
        count = _Count(what, error)
        while loader.check_event():
            count.event(loader.get_event())
    finally:
        loader.dispose()


def loads_yaml(text: str, what: str, error: type[TunerError] = ConfigError) -> Any:
    """The YAML document ``text`` as Python data, its expanded size and nesting bounded (ShapeError), ``error`` (one
    line) on anything it cannot be read as."""
    try:
        _count(text, what, error)
        loader = Loader(text)
        try:
            data = loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.YAMLError as err:
        raise error(f"the {what} is not valid YAML: {_problem(err)}") from None
    except RecursionError:
        raise ShapeError(f"the {what} nests deeper than {MAX_DEPTH} levels") from None
    except (ValueError, TypeError, OverflowError) as err:  # the constructor's own: 5,000 digits, 2001-13-45
        raise error(f"the {what} holds a value YAML cannot read: {_problem_of(err)}") from None
    check_shape(data, what)
    check_values(data, f"the {what}")  # .nan, .inf: no setting means them
    return data


def _problem_of(err: Exception) -> str:
    text = str(err).strip().splitlines()
    line = text[0] if text else type(err).__name__
    return line if len(line) <= _SHOWN else f"{line[:_SHOWN]}..."


__all__ = ["Loader", "loads_yaml"]
