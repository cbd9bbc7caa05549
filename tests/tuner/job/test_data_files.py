"""tuner.job.data_files' pre-scan (issue 33 §3): brackets inside strings do not count, nesting is counted across the
lines of a pretty-printed document, and a chat-shaped sample passes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuner.errors import ConfigError
from tuner.job.data_stream import MAX_DEPTH, scan_json


def test_brackets_in_strings_do_not_count_and_a_chat_sample_passes(tmp_path: Path) -> None:
    path = tmp_path / "ok.jsonl"
    chat = {"messages": [{"role": "user", "content": "[" * 500 + '\\" {{{'}] * 3, "source": "a", "target": "b"}
    path.write_text((json.dumps(chat) + "\n") * 10)
    scan_json(path)


def test_nesting_is_counted_across_the_lines_of_a_document(tmp_path: Path) -> None:
    path = tmp_path / "pretty.json"
    path.write_text(json.dumps({"a": _deep(MAX_DEPTH + 5)}, indent=1))  # one bracket a line
    with pytest.raises(ConfigError, match=f"nests deeper than {MAX_DEPTH} levels"):
        scan_json(path)
    path.write_text(json.dumps({"a": _deep(MAX_DEPTH - 2)}, indent=1))
    scan_json(path)


def _deep(levels: int) -> object:
    value: object = 1
    for _ in range(levels):
        value = [value]
    return value
