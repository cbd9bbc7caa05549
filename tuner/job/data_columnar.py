"""Parquet and Arrow data files measured from their metadata and indices before `datasets` loads them (issue 42 §5):
a 1,658-byte parquet whose one 20 KB string is dictionary-encoded over 100,000 rows decodes to 2 GB, which `datasets`
wrote into tuner's cache at 2.3 GB of memory, checking the row count only after.

- Parquet: the footer's length (the last 8 bytes) before pyarrow parses it; the row count from the metadata; the
  columns tuner tokenizes must be there and hold text, and only they are read (`datasets` is given ``columns``): their
  decoded bytes are summed row by row, a dictionary-encoded column through its indices (never expanded), a batch of
  rows at a time.
- Arrow (IPC stream or file, memory-mapped): each record batch validated, its rows counted and its decoded bytes summed
  (all columns: `datasets` reads them all), a dictionary column through its indices; a batch must fit
  ``MAX_BATCH_BYTES`` (`datasets` holds one whole).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tuner.errors import ConfigError
from tuner.job.data_stream import MAX_LINE_BYTES, compression, regular, shown, size_text

MAX_ROWS = 20_000_000  # samples one dataset may hold, all splits together (a full scan reads 2,000,000 of a split)
MAX_FOOTER_BYTES = 16 << 20  # a parquet footer: the schema and each row group's column metadata
MAX_BATCH_BYTES = 256 << 20  # one Arrow record batch decoded (`datasets` holds one at a time)
_SCAN_ROWS = 4096  # rows read at a time while measuring


@dataclass(frozen=True)
class ColumnarRead:
    """What a parquet / arrow file decodes to: bytes (of the columns `datasets` reads), rows, the largest row of the
    text columns."""

    decoded: int
    rows: int
    largest: int


def _is_text(kind: Any) -> bool:
    import pyarrow as pa

    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return bool(pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind))


def text_columns(path: Path, names: Sequence[str], schema: Any, columns: Sequence[str]) -> None:
    """ConfigError (one line) unless each of ``columns`` is in ``names`` and holds text in ``schema``."""
    for column in columns:
        if column not in names:
            listed = ", ".join(str(n)[:80] for n in list(names)[:20])
            raise ConfigError(f"data file {shown(path)} has no column {column!r}; its columns are {listed}")
        kind = schema.field(column).type
        if not _is_text(kind):
            raise ConfigError(
                f"data file {shown(path)} column {column!r} holds {str(kind)[:80]}, not text; tuner tokenizes a "
                "column of one string per sample (a pair or a list is not one text)"
            )


def decoded_lengths(array: Any) -> np.ndarray:
    """Bytes each row of ``array`` decodes to (a dictionary array through its indices; null: 0)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(array, pa.ChunkedArray):  # chunk by chunk: a memory-mapped column is never copied
        parts = [decoded_lengths(chunk) for chunk in array.chunks]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    if pa.types.is_dictionary(array.type):
        per_entry = pc.fill_null(pc.binary_length(array.dictionary), 0)
        lengths = pc.fill_null(pc.take(per_entry, array.indices), 0)
    elif _is_text(array.type) or pa.types.is_binary(array.type) or pa.types.is_large_binary(array.type):
        lengths = pc.fill_null(pc.binary_length(array), 0)
    else:  # fixed-width and nested columns: their buffers (a nested dictionary is refused before this)
        return np.full(len(array), array.nbytes // max(len(array), 1), dtype=np.int64)
    return np.asarray(lengths.to_numpy(zero_copy_only=False), dtype=np.int64)


def _count(path: Path, rows: int, rows_left: int) -> None:
    if rows < 0 or rows > rows_left:
        raise ConfigError(
            f"data file {shown(path)} holds {rows:,} rows, past the {MAX_ROWS:,} samples tuner reads of one dataset "
            "(all its files); give a smaller sample of it"
        )


def _measure(path: Path, batches: Iterable[Any], text: Sequence[str], limit: int) -> tuple[int, int]:
    """(decoded bytes, largest text row) of ``batches``; ConfigError past ``limit`` bytes or MAX_LINE_BYTES a row."""
    decoded = largest = 0
    for batch in batches:
        per_row = np.zeros(batch.num_rows, dtype=np.int64)
        for name in batch.schema.names:
            lengths = decoded_lengths(batch.column(name))
            decoded += int(lengths.sum())
            if name in text:
                per_row += lengths
        largest = max(largest, int(per_row.max(initial=0)))
        if decoded > limit:
            raise ConfigError(
                f"data file {shown(path)} decodes to over {size_text(limit)}, more than tuner reads of one dataset "
                "(datasets writes it all into tuner's cache); give a smaller sample of it"
            )
        if largest > MAX_LINE_BYTES:
            raise ConfigError(
                f"data file {shown(path)} has a sample of over {MAX_LINE_BYTES >> 20} MiB of text ({size_text(largest)}"
                "); a sample is at most that"
            )
    return decoded, largest


def _footer(path: Path) -> None:
    size = path.stat().st_size
    with open(path, "rb") as fh:
        fh.seek(max(0, size - 8))
        tail = fh.read(8)
    length = int.from_bytes(tail[:4], "little") if len(tail) == 8 else -1
    if tail[4:] != b"PAR1" or not 0 < length <= size - 12:
        raise ConfigError(f"data file {shown(path)} is not a parquet file (no footer); give the file pyarrow wrote")
    if length > MAX_FOOTER_BYTES:
        raise ConfigError(
            f"data file {shown(path)} has a parquet footer of {size_text(length)}, over the {MAX_FOOTER_BYTES >> 20} "
            "MiB tuner reads (its schema and row groups' metadata are a few KiB)"
        )


def check_parquet(path: Path, columns: Sequence[str], limit: int, rows_left: int) -> ColumnarRead:
    """The parquet file ``path`` measured (only ``columns`` are read: `datasets` is given them); ConfigError (one
    line) when it is not parquet, lacks a column, holds too many rows or decodes past ``limit`` bytes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    regular(path)
    _plain(path)
    _footer(path)
    try:
        plain = pq.ParquetFile(path)
        _count(path, plain.metadata.num_rows, rows_left)
        text_columns(path, plain.schema_arrow.names, plain.schema_arrow, columns)
        parquet = pq.ParquetFile(path, read_dictionary=list(columns))  # text columns: dictionaries never expanded
        batches = parquet.iter_batches(batch_size=_SCAN_ROWS, columns=list(columns), use_threads=False)
        decoded, largest = _measure(path, batches, columns, limit)
    except (pa.ArrowException, OSError, ValueError) as err:
        raise ConfigError(f"data file {shown(path)} cannot be read as parquet: {_first(err)}") from None
    return ColumnarRead(decoded, parquet.metadata.num_rows, largest)


def _nested_dictionary(kind: Any, top: bool = True) -> bool:
    import pyarrow as pa

    if pa.types.is_dictionary(kind):
        return not top or _nested_dictionary(kind.value_type, top=False)
    return any(_nested_dictionary(kind.field(i).type, top=False) for i in range(kind.num_fields))


def _arrow_batches(path: Path, source: Any, columns: Sequence[str], rows_left: int) -> Any:
    """The record batches of an Arrow stream or file, each validated and sized before it is measured."""
    import pyarrow as pa

    try:
        reader = pa.ipc.open_stream(source)
        batches: Iterable[Any] = reader
    except (OSError, pa.ArrowInvalid):
        file_reader = pa.ipc.open_file(source)
        reader = file_reader
        batches = (file_reader.get_batch(i) for i in range(file_reader.num_record_batches))
    for field in reader.schema:
        if _nested_dictionary(field.type):
            raise ConfigError(f"data file {shown(path)} column {field.name[:80]!r} nests a dictionary (not read)")
    text_columns(path, reader.schema.names, reader.schema, columns)
    rows = 0
    for batch in batches:
        batch.validate(full=True)  # offsets inside their buffers before anything reads them
        rows += batch.num_rows
        _count(path, rows, rows_left)
        whole = sum(int(decoded_lengths(column).sum()) for column in batch.columns)
        if whole > MAX_BATCH_BYTES:
            raise ConfigError(
                f"data file {shown(path)} has a record batch that decodes to {size_text(whole)}, over the "
                f"{MAX_BATCH_BYTES >> 20} MiB datasets holds at once; write it in smaller batches"
            )
        yield batch


def check_arrow(path: Path, columns: Sequence[str], limit: int, rows_left: int) -> ColumnarRead:
    """The Arrow IPC file ``path`` measured (every column: `datasets` reads them all); ConfigError (one line) as
    ``check_parquet``."""
    import pyarrow as pa

    regular(path)
    _plain(path)
    rows = 0
    try:
        with pa.memory_map(str(path)) as source:
            counted = _counted(_arrow_batches(path, source, columns, rows_left))
            decoded, largest = _measure(path, counted, columns, limit)
            rows = counted.rows
    except (pa.ArrowException, OSError, ValueError) as err:
        raise ConfigError(f"data file {shown(path)} cannot be read as Arrow: {_first(err)}") from None
    return ColumnarRead(decoded, rows, largest)


class _counted:
    """Batches passed through, their rows counted."""

    def __init__(self, batches: Iterable[Any]) -> None:
        self.batches = batches
        self.rows = 0

    def __iter__(self) -> Any:
        for batch in self.batches:
            self.rows += batch.num_rows
            yield batch


def _plain(path: Path) -> None:
    protocol = compression(path)
    if protocol is not None:
        raise ConfigError(f"data file {shown(path)} is {protocol}-compressed; datasets reads this format uncompressed")


def _first(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return (text[0] if text else type(err).__name__)[:200]


__all__ = [
    "MAX_BATCH_BYTES",
    "MAX_ROWS",
    "ColumnarRead",
    "check_arrow",
    "check_parquet",
    "decoded_lengths",
    "text_columns",
]
