"""The text data formats read before `datasets` sees a byte (issue 42 §1, §2, §5): JSON / JSON-lines / ndjson and CSV,
plain or compressed, each measured in one pass of linear time under a cap on the bytes it decompresses to.

A file is opened as `datasets` opens it (its own choice of compression, by suffix or magic number): gzip, bz2 and xz
are decompressed here a chunk at a time, never past ``MAX_DATA_BYTES`` (a 135-byte ``.jsonl.gz`` may hold
anything); zstd and lz4 where their module is installed; an archive (zip, rar) is refused: unpack it into the folder.

- JSON: depth, line and document bytes (tuner.job.json_scan); a file that starts with ``[`` or whose values span
  lines is read whole by `datasets` (ujson, then pandas), so it must fit ``MAX_DOCUMENT_BYTES``.
- CSV: a record (its physical lines until its quotes balance, as pandas' parser joins them) of at most
  ``MAX_LINE_BYTES``; the largest is returned so that pandas' read batch can be sized in bytes, not rows.
"""

from __future__ import annotations

import bz2
import gzip
import importlib
import lzma
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tuner.errors import ConfigError
from tuner.job.json_scan import JsonScan

MAX_LINE_BYTES = 4 << 20  # one sample per line: a 4 MiB line is ~1M tokens of text
MAX_DEPTH = 64  # a chat sample nests 3-4 levels (pyarrow's JSON reader crashes at 20,000)
MAX_DOCUMENT_BYTES = 64 << 20  # a JSON file `datasets` parses whole: ~10x its size in Python objects
MAX_DATA_BYTES = 4 << 30  # what one dataset may decode to (datasets writes it all into tuner's cache as Arrow)
CHUNK = 1 << 20

_OPENERS: dict[str, Callable[..., Any]] = {"gzip": gzip.open, "bz2": bz2.open, "xz": lzma.open}
_OPTIONAL = {"zstd": "zstandard", "lz4": "lz4.frame"}  # each module's open(path, "rb")


def shown(path: Path | str, keep: int = 120) -> str:
    text = repr(str(path))
    return text if len(text) <= keep else f"{text[:keep]}..."


def size_text(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):,.1f} {unit}"
    return f"{n:,} bytes"


@dataclass(frozen=True)
class TextRead:
    """What one text file decodes to: its bytes, its largest sample (line or record), whether it is read whole."""

    decoded: int
    largest: int
    whole: bool = False


def regular(path: Path) -> None:
    """ConfigError unless ``path`` is a regular file (a FIFO or device in a data folder would block or never end)."""
    try:
        mode = os.stat(path).st_mode
    except OSError as err:
        raise ConfigError(f"cannot read the data file {shown(path)}: {err.strerror or err}") from None
    if not stat.S_ISREG(mode):
        raise ConfigError(f"data file {shown(path)} is not a regular file; tuner reads no pipes or devices")


def compression(path: Path) -> str | None:
    """The compression `datasets` reads ``path`` with (its own function: the suffix, else the magic number)."""
    from datasets.utils.file_utils import _get_extraction_protocol

    try:
        return _get_extraction_protocol(str(path))
    except NotImplementedError as err:  # rar
        raise ConfigError(f"data file {shown(path)}: {str(err)[:200]} (unpack it into the folder)") from None


def open_data(path: Path) -> IO[bytes]:
    """``path`` opened for reading as `datasets` reads it: decompressed where it is compressed."""
    regular(path)
    protocol = compression(path)
    if protocol is None:
        return open(path, "rb")
    if protocol in _OPENERS:
        opened: IO[bytes] = _OPENERS[protocol](path, "rb")
        return opened
    if protocol in _OPTIONAL:
        try:
            module = importlib.import_module(_OPTIONAL[protocol])
        except ImportError:
            raise ConfigError(
                f"data file {shown(path)} is {protocol}-compressed and {_OPTIONAL[protocol]} is not installed; "
                "decompress it"
            ) from None
        framed: IO[bytes] = module.open(path, "rb")
        return framed
    raise ConfigError(
        f"data file {shown(path)} is a {protocol} archive; tuner reads plain or gzip / bz2 / xz files: unpack it "
        "into the folder"
    )


def _chunks(path: Path, limit: int) -> Any:
    """The decompressed bytes of ``path`` a chunk at a time; ConfigError past ``limit`` bytes."""
    total = 0
    try:
        with open_data(path) as fh:
            while chunk := fh.read(CHUNK):
                total += len(chunk)
                if total > limit:
                    raise ConfigError(
                        f"data file {shown(path)} decompresses to over {size_text(limit)}, more than tuner reads of "
                        "one dataset (datasets writes it all into tuner's cache); give a smaller sample of it"
                    )
                yield chunk
    except (OSError, EOFError, lzma.LZMAError) as err:
        raise ConfigError(f"cannot read the data file {shown(path)}: {err}") from None


def scan_json(path: Path, limit: int = MAX_DATA_BYTES) -> TextRead:
    """ConfigError (one line) when a line of the JSON / JSON-lines file ``path`` is longer than MAX_LINE_BYTES, the
    text nests deeper than MAX_DEPTH (counted across lines, as a pretty-printed document nests), or a file read whole
    is over MAX_DOCUMENT_BYTES."""
    scan = JsonScan(MAX_LINE_BYTES, MAX_DEPTH)
    total = 0
    for chunk in _chunks(path, limit):
        total += len(chunk)
        overrun = scan.feed(chunk)
        if overrun is not None and overrun.what == "line":
            raise ConfigError(
                f"data file {shown(path)} line {overrun.line:,} is longer than {MAX_LINE_BYTES >> 20} MiB; tuner "
                "reads JSON one sample per line of at most that (a longer line costs gigabytes in pyarrow)"
            )
        if overrun is not None:
            raise ConfigError(
                f"data file {shown(path)} line {overrun.line:,} nests deeper than {MAX_DEPTH} levels; a sample "
                "nests a few (pyarrow's JSON reader crashes on deep nesting): remove the deep column"
            )
        whole = scan.first == b"[" or scan.spans_lines
        if whole and total > MAX_DOCUMENT_BYTES:
            raise ConfigError(
                f"data file {shown(path)} is one JSON document (a list, or values across lines) of over "
                f"{MAX_DOCUMENT_BYTES >> 20} MiB, which datasets parses whole; write it as JSON lines, one sample "
                "a line"
            )
    whole = scan.first == b"[" or scan.spans_lines
    return TextRead(total, total if whole else max(scan.longest, scan.line_bytes), whole=whole)


def _lines(path: Path, limit: int) -> Any:
    """(line number, its bytes) of ``path`` decompressed; ConfigError on a line over MAX_LINE_BYTES."""
    total = 0
    with open_data(path) as fh:
        number = 0
        while line := fh.readline(MAX_LINE_BYTES + 2):
            number += 1
            total += len(line)
            if len(line.rstrip(b"\r\n")) > MAX_LINE_BYTES:
                raise ConfigError(
                    f"data file {shown(path)} line {number:,} is longer than {MAX_LINE_BYTES >> 20} MiB; a CSV "
                    "record is one sample of at most that (a longer one costs gigabytes in pandas)"
                )
            if total > limit:
                raise ConfigError(
                    f"data file {shown(path)} decompresses to over {size_text(limit)}, more than tuner reads of one "
                    "dataset; give a smaller sample of it"
                )
            yield number, line


def scan_csv(path: Path, limit: int = MAX_DATA_BYTES) -> TextRead:
    """The CSV file ``path`` measured: ConfigError (one line) on a record (a quoted field may span lines) of over
    MAX_LINE_BYTES; else its decoded bytes and largest record."""
    total = largest = record = 0
    quotes = 0
    start = 1
    try:
        for number, line in _lines(path, limit):
            total += len(line)
            record += len(line)
            quotes += line.count(b'"')
            if record > MAX_LINE_BYTES:
                raise ConfigError(
                    f"data file {shown(path)} record at line {start:,} is longer than {MAX_LINE_BYTES >> 20} MiB (a "
                    "quoted field runs on); a CSV record is one sample of at most that"
                )
            if quotes % 2 == 0:  # the record ends with this line ("" inside a field keeps the count even)
                largest = max(largest, record)
                record = quotes = 0
                start = number + 1
    except (OSError, EOFError, lzma.LZMAError) as err:
        raise ConfigError(f"cannot read the data file {shown(path)}: {err}") from None
    return TextRead(total, max(largest, record))


__all__ = [
    "MAX_DATA_BYTES",
    "MAX_DEPTH",
    "MAX_DOCUMENT_BYTES",
    "MAX_LINE_BYTES",
    "TextRead",
    "compression",
    "open_data",
    "regular",
    "scan_csv",
    "scan_json",
    "shown",
    "size_text",
]
