"""The user's data files checked before `datasets` reads them (issue 33 §3, §7, §8): pure but for the reads.

- JSON / JSON-lines files are pre-scanned, a line at a time and never more than ``MAX_LINE_BYTES`` of one: a line
  longer than that (19 MB cost 2.45 GB in pyarrow) or nesting deeper than ``MAX_DEPTH`` (pyarrow's JSON reader
  segfaults at 20,000 levels, `datasets` at 10,000) is refused in one line before pyarrow sees the file.
- A saved dataset's ``state.json`` / ``dataset_dict.json`` is read as a bounded JSON object (not JSON, a list, not
  UTF-8: one line, not a traceback).
- A data folder's files are the ones `datasets` resolves (its README's ``configs`` may name any path): each must lie
  inside the folder given, or the job line would name one folder while the lengths come from another.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from tuner.bounded import loads_json, read_text_file
from tuner.errors import ConfigError

MAX_LINE_BYTES = 4 << 20  # one sample per line: a 4 MiB line is ~1M tokens of text
MAX_DEPTH = 64  # a chat sample nests 3-4 levels
JSON_SUFFIXES = (".json", ".jsonl")
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')  # unrolled: linear in the line, runs consumed at once
_OPEN = frozenset(b"[{")
_CLOSE = frozenset(b"]}")


def _name(path: Path, keep: int = 120) -> str:
    text = repr(str(path))
    return text if len(text) <= keep else f"{text[:keep]}..."


def _deepest(stripped: bytes, carried: int) -> tuple[int, int]:
    """(the deepest nesting within the line, the depth after it), from the depth before it; strings removed."""
    arr = np.frombuffer(stripped, dtype=np.uint8)
    steps = np.isin(arr, list(_OPEN)).astype(np.int64) - np.isin(arr, list(_CLOSE)).astype(np.int64)
    depth = carried + np.cumsum(steps)
    return int(depth.max(initial=carried)), max(0, int(depth[-1]) if len(depth) else carried)


def scan_json(path: Path) -> None:
    """ConfigError (one line) when a line of the JSON / JSON-lines file ``path`` is longer than MAX_LINE_BYTES or the
    text nests deeper than MAX_DEPTH (counted across lines, as a pretty-printed JSON document nests)."""
    carried = 0
    with open(path, "rb") as fh:
        for number, line in enumerate(iter(lambda: fh.readline(MAX_LINE_BYTES + 1), b""), start=1):
            if len(line) > MAX_LINE_BYTES:
                raise ConfigError(
                    f"data file {_name(path)} line {number:,} is longer than {MAX_LINE_BYTES >> 20} MiB; tuner reads "
                    "JSON one sample per line of at most that (a longer line costs gigabytes in pyarrow)"
                )
            if carried == 0 and not any(b in line for b in (b"[", b"{")):
                continue
            stripped = _STRING.sub(b'""', line) if b'"' in line else line
            opens = stripped.count(b"[") + stripped.count(b"{")
            if carried + opens <= MAX_DEPTH:  # cannot pass the bound within this line
                carried = max(0, carried + opens - stripped.count(b"]") - stripped.count(b"}"))
                continue
            deepest, carried = _deepest(stripped, carried)
            if deepest > MAX_DEPTH:
                raise ConfigError(
                    f"data file {_name(path)} line {number:,} nests deeper than {MAX_DEPTH} levels; a sample nests a "
                    "few (pyarrow's JSON reader crashes on deep nesting): remove the deep column"
                )


def scan_files(files: Iterable[Path]) -> None:
    """``scan_json`` of each JSON / JSON-lines file among ``files``."""
    for path in files:
        if path.suffix.lower() in JSON_SUFFIXES:
            scan_json(path)


def inside(folder: Path, files: Iterable[str]) -> list[Path]:
    """The resolved ``files``; ConfigError when one lies outside ``folder`` (``../``, an absolute path, a link)."""
    root = folder.resolve()
    out = []
    for name in files:
        resolved = Path(name).resolve()
        if not resolved.is_relative_to(root):
            raise ConfigError(
                f"data folder {_name(folder)} names a data file outside it ({_name(resolved)}); tuner reads only the "
                "files inside the folder it is given: move the file in, or give its own folder"
            )
        out.append(resolved)
    return out


def _json_object(path: Path, what: str) -> dict[str, Any]:
    data = loads_json(read_text_file(path, what), what)
    if not isinstance(data, dict):
        raise ConfigError(f"{what} {_name(path)} is not a JSON object; save the dataset again with save_to_disk")
    return data


def saved_state(folder: Path) -> dict[str, Any] | None:
    """A saved Dataset's ``state.json`` as an object; None when ``folder`` holds none."""
    path = folder / "state.json"
    return _json_object(path, "saved dataset state") if path.is_file() else None


def saved_fingerprints(folder: Path) -> object:
    """What identifies a saved dataset by its own account: its fingerprint, or each split's of a DatasetDict (whose
    ``dataset_dict.json`` is checked as an object); None for a folder that is neither."""
    state = saved_state(folder)
    if state is not None:
        return state.get("_fingerprint")
    if not (folder / "dataset_dict.json").is_file():
        return None
    _json_object(folder / "dataset_dict.json", "saved dataset dict")
    splits = sorted(p.name for p in folder.iterdir() if p.is_dir())
    return [(split, (saved_state(folder / split) or {}).get("_fingerprint")) for split in splits]


__all__ = ["MAX_DEPTH", "MAX_LINE_BYTES", "inside", "saved_fingerprints", "saved_state", "scan_files", "scan_json"]
