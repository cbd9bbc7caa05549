"""One bounded reader per data format, chosen by what `datasets` will read (issue 42 §1, §5): every file it resolves
for a data file or folder (every split: it builds them all) is measured by the reader of the format `datasets` reads
it as, before `datasets` sees a byte; what `datasets` is then told keeps its read batches bounded in bytes.

- JSON / JSON lines / ndjson, plain or compressed: tuner.job.data_stream.scan_json (depth, line and document bytes;
  `datasets` reads 10 MB a batch already).
- CSV: tuner.job.data_stream.scan_csv; pandas' batch (``chunksize``, 10,000 rows by default: 40 GB of 4 MiB records)
  is sized to ``READ_BATCH_BYTES`` by the largest record.
- Parquet: tuner.job.data_columnar.check_parquet; `datasets` reads only the text columns (``columns``), a batch of
  rows sized to ``READ_BATCH_BYTES`` (``batch_size``; its default is a whole row group).
- Arrow: tuner.job.data_columnar.check_arrow.
- Any other format (`datasets` picks a folder's by its most common file kind: text, xml, images ...) is refused.

All files of one dataset together decode to at most ``MAX_DATA_BYTES`` (what `datasets` writes into tuner's cache)
and hold at most ``MAX_ROWS`` rows; past either, one line says the size and the bound.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.errors import ConfigError
from tuner.job.data_columnar import MAX_ROWS, check_arrow, check_parquet
from tuner.job.data_stream import MAX_DATA_BYTES, scan_csv, scan_json, shown

READ_BATCH_BYTES = 16 << 20  # what `datasets` decodes at once (a pandas / parquet batch)
MAX_BATCH_ROWS = 10_000  # the rows of one batch at most (pandas' default chunk)
FORMATS = ("json", "csv", "parquet", "arrow")


@dataclass(frozen=True)
class DataPlan:
    """The files `datasets` will read, measured: their builder, their decoded bytes, and the keyword arguments that
    keep its reads bounded (``load_dataset(..., **kwargs)``)."""

    builder: str
    decoded: int
    kwargs: dict[str, Any] = field(default_factory=dict)


def batch_rows(largest: int) -> int:
    """Rows per read batch: ``READ_BATCH_BYTES`` of the largest row, at least 1, at most ``MAX_BATCH_ROWS``."""
    return max(1, min(MAX_BATCH_ROWS, READ_BATCH_BYTES // max(largest, 1)))


def plan(
    builder: str,
    files: Sequence[Path],
    columns: Sequence[str],
    where: str,
    limit: int | None = None,
    rows: int | None = None,
) -> DataPlan:
    """Each of ``files`` measured by the reader of ``builder``'s format; ConfigError (one line) on the first that
    passes a bound (all together: ``limit`` decoded bytes, ``rows`` rows), or when ``builder`` is not one tuner
    reads."""
    if builder not in FORMATS:
        raise ConfigError(
            f"{where} is read by datasets as {builder!r} files; tuner reads JSON / JSON lines, CSV, parquet and "
            "Arrow: give a folder of those (datasets picks a folder's format by its most common file kind)"
        )
    limit = MAX_DATA_BYTES if limit is None else limit
    budget, rows_left, largest = limit, MAX_ROWS if rows is None else rows, 0
    for path in files:
        if builder == "json":
            text = scan_json(path, budget)
            decoded, size = text.decoded, text.largest
        elif builder == "csv":
            text = scan_csv(path, budget)
            decoded, size = text.decoded, text.largest
        else:
            check = check_parquet if builder == "parquet" else check_arrow
            read = check(path, columns, budget, rows_left)
            decoded, size = read.decoded, read.largest
            rows_left -= read.rows
        budget -= decoded
        largest = max(largest, size)
    kwargs: dict[str, Any] = {}
    if builder == "csv":
        kwargs["chunksize"] = batch_rows(largest)
    if builder == "parquet":
        kwargs.update(columns=list(columns), batch_size=batch_rows(largest))
    return DataPlan(builder, limit - budget, kwargs)


def one_file_builder(path: Path, builders: dict[str, str]) -> str:
    """The builder of the lone data file ``path`` by its suffix; ConfigError for any other."""
    builder = builders.get(path.suffix.lower())
    if builder is None:
        raise ConfigError(
            f"data file {shown(path)} is not {', '.join(builders)}; give a file of one of these kinds, a folder of "
            "them, or a dataset saved with save_to_disk"
        )
    return builder


__all__ = ["FORMATS", "MAX_DATA_BYTES", "READ_BATCH_BYTES", "DataPlan", "batch_rows", "one_file_builder", "plan"]
