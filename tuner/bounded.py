"""Bounds on what tuner reads from a user: files (regular files only, a few MiB at most) and nested data (JSON from a
file, a mapping from ``tuner.tune``, an API body), checked before anything is parsed further or stored.

A 900-deep ``training_args`` would be stored and then fail every later read (recursion in the serialiser), and
``--baseline /dev/zero`` would read without end: every file reader (baseline, training args, space, lengths) reads
through ``read_text_file``, and every nested input passes ``check_shape``. Pure but for the one read.
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuner.errors import ConfigError, TunerError

MAX_FILE_BYTES = 4 * 1024 * 1024  # a DeepSpeed JSON, training args or space file is a few KiB
MAX_LENGTHS_BYTES = 64 * 1024 * 1024  # a lengths file: one number per sample (10M samples)
MAX_DEPTH = 32  # a DeepSpeed JSON nests 3-4 deep
MAX_ITEMS = 10_000  # keys and list items in one document, all levels together


class ShapeError(TunerError):
    """Nested input past MAX_DEPTH or MAX_ITEMS (HTTP 422)."""

    http_status = 422


def read_text_file(path: Path, what: str, limit: int = MAX_FILE_BYTES, error: type[TunerError] = ConfigError) -> str:
    """The UTF-8 text of the regular file ``path``, at most ``limit`` bytes; ``error`` (one line) otherwise."""
    try:
        info = os.stat(path)
    except OSError as err:
        raise error(f"cannot read the {what} {str(path)!r}: {err.strerror or err}") from None
    if not stat.S_ISREG(info.st_mode):
        raise error(f"the {what} {str(path)!r} is not a regular file; give a file (tuner reads no devices or pipes)")
    try:
        with open(path, "rb") as fh:
            data = fh.read(limit + 1)  # a file that grows, or says size 0 (/proc), is still read only this far
    except OSError as err:
        raise error(f"cannot read the {what} {str(path)!r}: {err.strerror or err}") from None
    if len(data) > limit:
        raise error(f"the {what} {str(path)!r} is over {_size(limit)}; tuner reads at most that much of it")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise error(f"the {what} {str(path)!r} is not UTF-8 text") from None


class _Refused(ValueError):
    """A JSON document tuner does not read: ``NaN`` / ``Infinity``, a key given twice (issue 42 §10)."""


def _no_constant(name: str) -> Any:
    raise _Refused(f"holds {name}, not a finite number; give the number the setting means")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:  # json.loads keeps the last; their reader may not: say which, rather than guess
            raise _Refused(f"has the key {_short(key, 80)!r} twice in one object; keep one")
        out[key] = value
    return out


def loads_json(text: str, what: str, error: type[TunerError] = ConfigError) -> Any:
    """``json.loads`` of ``text``, its nesting and size checked (``check_shape``); ``error`` on invalid JSON, on
    ``NaN`` / ``Infinity`` (JSON has no such numbers: Python's reader takes them) and on a key given twice."""
    try:
        data = json.loads(text, parse_constant=_no_constant, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as err:
        raise error(f"the {what} is not valid JSON: {err.msg} at line {err.lineno} column {err.colno}") from None
    except RecursionError:
        raise ShapeError(f"the {what} nests deeper than {MAX_DEPTH} levels") from None
    except _Refused as err:
        raise error(f"the {what} {err}") from None
    except ValueError:  # an integer of more than 4,300 digits (sys.int_info.str_digits_check_threshold)
        raise error(f"the {what} holds a number too long to read; a config's numbers are a few digits") from None
    check_shape(data, what)
    return data


def check_values(data: Any, what: str, max_text: int | None = None, max_key: int | None = None) -> None:
    """Raises ShapeError at the first float that is not finite (NaN, inf), string longer than ``max_text``
    characters or key longer than ``max_key`` (None: not bounded), naming its path (cut). Iterative; run after
    ``check_shape``, which bounds how much there is to walk."""
    stack: list[tuple[Any, str]] = [(data, what)]
    while stack:
        value, path = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            raise ShapeError(f"{_short(path)} is {value}, not a finite number; give the number the setting means")
        if isinstance(value, str) and max_text is not None and len(value) > max_text:
            raise ShapeError(f"{_short(path)} is {len(value):,} characters; a setting's text is at most {max_text:,}")
        if isinstance(value, Mapping) and max_key is not None:
            for key in value:
                if isinstance(key, str) and len(key) > max_key:
                    raise ShapeError(
                        f"{_short(path)} has a key of {len(key):,} characters; a setting's name is at most {max_key}"
                    )
        stack.extend((child, child_path) for child_path, child in _children(value, path))


def check_shape(data: Any, what: str, max_items: int = MAX_ITEMS) -> None:
    """Raises ShapeError naming the first path deeper than MAX_DEPTH, or when ``data`` holds more than ``max_items``
    keys and items. Iterative: no recursion on hostile depth."""
    stack: list[tuple[Any, str, int]] = [(data, what, 0)]
    items = 0
    while stack:
        value, path, depth = stack.pop()
        children = _children(value, path)
        if not children:
            continue
        if depth >= MAX_DEPTH:
            raise ShapeError(f"{_short(path)} nests deeper than {MAX_DEPTH} levels; a config nests a few")
        items += len(children)
        if items > max_items:
            raise ShapeError(f"{what} holds more than {max_items} keys and items; a config holds a few hundred")
        stack.extend((child, child_path, depth + 1) for child_path, child in children)


def _children(value: Any, path: str) -> list[tuple[str, Any]]:
    if isinstance(value, Mapping):
        return [(f"{path}.{key}", child) for key, child in value.items()]
    if isinstance(value, (list, tuple)):
        return [(f"{path}[{i}]", child) for i, child in enumerate(value)]
    return []


def _short(path: str, keep: int = 120) -> str:
    """``path`` (the file, then the key path inside it) cut in the middle past ``keep`` characters: the file's start
    and the key's end stay (a long temporary folder once cut the key that was the answer)."""
    if len(path) <= keep:
        return path
    head = keep // 3
    return f"{path[:head]}...{path[len(path) - (keep - head) :]}"


def _size(n: int) -> str:
    return f"{n // (1024 * 1024)} MiB" if n >= 1024 * 1024 else f"{n // 1024} KiB"


__all__ = [
    "MAX_DEPTH",
    "MAX_FILE_BYTES",
    "MAX_ITEMS",
    "MAX_LENGTHS_BYTES",
    "ShapeError",
    "check_shape",
    "check_values",
    "loads_json",
    "read_text_file",
]
