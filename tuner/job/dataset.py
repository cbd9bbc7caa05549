"""The user's dataset read the way their Trainer reads it: token lengths per sample, with their tokenizer.

A source is a `datasets` dataset saved with ``save_to_disk``, a local data file or folder (JSON lines, JSON, CSV,
Parquet: `datasets` infers a folder's splits from its file names), or a hub dataset name already in the local cache
(read offline). Columns are named, never guessed: ``--input-column`` + ``--target-column`` (seq2seq) or
``--text-column`` (causal LM). Lengths count the tokens the tokenizer makes with its special tokens and no
truncation, by a batched ``map`` (``num_proc`` workers on large sets, a progress bar on stderr).

The lengths are cached under ``<cache dir>/lengths``, keyed by the dataset's identity (a saved dataset's fingerprint,
a data file's path, size and modification time, a hub dataset's fingerprint) and the tokenizer's (its directory's
files, or its cached hub snapshot), so a second read of a local dataset loads no `datasets` and no tokenizer.

Every mistake is one ConfigError naming the fix, raised before any probe.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tuner.errors import ConfigError
from tuner.job import data_files, dataset_io
from tuner.job.data_source import DataSource
from tuner.job.lengths import SampleLengths
from tuner.job.own_code import refuse_own_code

if TYPE_CHECKING:
    from tuner.job.length_summary import DataOrigin

#: splits larger than this are scanned only with --max-samples (a seeded random sample)
MAX_SCAN = 2_000_000
#: below this many samples one process tokenizes (forking workers costs more than it saves); 2 cores or fewer: always
PARALLEL_FROM = 20_000
_CACHE_VERSION = 2  # 2: keys hold every file's resolved path, size and time (issue 33 §8)
#: the lengths cache's size at most: the least recently used files go first (a file is 8 bytes a sample)
MAX_CACHE_BYTES = 256 << 20


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


@dataclass(frozen=True)
class DataLengths:
    """The lengths read, and where from (said on the job line)."""

    lengths: SampleLengths
    source: DataSource
    tokenizer: str
    total: int  # samples in the split (more than len(lengths) when a sample was scanned)
    cached: bool

    @property
    def sampled(self) -> bool:
        return len(self.lengths) < self.total

    def origin(self) -> DataOrigin:
        """Where these lengths came from, as a study stores it with their summary."""
        from tuner.job.length_summary import DataOrigin

        s = self.source
        columns = (s.input_column, s.target_column, s.text_column)
        return DataOrigin.of_dataset(s.path, s.split, columns, self.tokenizer, self.total, s.max_samples)

    def describe(self) -> str:
        n = len(self.lengths)
        what = f"a seeded random {n:,} of {self.total:,} samples" if self.sampled else f"{n:,} samples"
        return f"{what} of {self.source.path} [{self.source.split}], tokenized with {self.tokenizer}"


def tokenizer_for(tokenizer: str | None, model: str | None, option: Callable[[str], str] = _flag) -> str:
    """``tokenizer``, else the model's own (an HF id or a save_pretrained directory); built-in presets have none."""
    if tokenizer:
        return tokenizer
    if model is None:
        raise ConfigError(f"give {option('tokenizer')} ID_OR_DIR (or a model, whose own tokenizer is then used)")
    from tuner.job.model_source import resolve_model

    spec = resolve_model(model)
    if spec.source.startswith("builtin:"):
        raise ConfigError(f"{model} is a built-in preset with no tokenizer; give {option('tokenizer')} ID_OR_DIR")
    return spec.source


def read_lengths(source: DataSource, tokenizer: str, cache_dir: Path, progress: bool = True) -> DataLengths:
    """The per-sample token lengths of ``source``'s split under ``tokenizer`` (an id or a directory)."""
    input_column, target_column = source.columns()
    if source.max_samples is not None and source.max_samples < 1:
        raise ConfigError(f"--max-samples {source.max_samples} scans nothing; give a positive number of samples")
    refuse_own_code(tokenizer, "tokenizer")  # before anything is read (issue 33 §1)
    key = _local_key(source, tokenizer)
    if key is not None and (hit := _read_cache(cache_dir, key, source, tokenizer)) is not None:
        return hit
    ds = dataset_io.load_split(source, cache_dir / "datasets", progress)
    dataset_io.check_columns(ds, source, [c for c in (input_column, target_column) if c is not None])
    total = len(ds)
    if total == 0:
        raise ConfigError(f"dataset {source.path} [{source.split}] has no samples; give a split that holds data")
    if key is None:
        key = _key(["hub", source.path, ds._fingerprint, *_source_fields(source), _tokenizer_identity(tokenizer)])
        if (hit := _read_cache(cache_dir, key, source, tokenizer)) is not None:
            return hit
    ds = _sample(ds, source, total)
    tok = dataset_io.load_tokenizer(tokenizer)
    # a fast tokenizer's batch encode already uses every core (rayon); worker processes pay for themselves only
    # with cores to spare (2 cores, 10,000 samples: 25 s in one process, 33 s with two; benchmarks/BENCHMARKS.md)
    cores = os.cpu_count() or 1
    num_proc = min(cores, 8) if cores > 2 and len(ds) >= PARALLEL_FROM else None
    inputs, targets = dataset_io.token_lengths(ds, tok, input_column, target_column, num_proc, progress, key)
    lengths = SampleLengths.of(inputs, targets)
    _write_cache(cache_dir, key, lengths, total)
    return DataLengths(lengths, source, tokenizer, total, cached=False)


def _sample(ds: Any, source: DataSource, total: int) -> Any:
    if source.max_samples is None:
        if total > MAX_SCAN:
            raise ConfigError(
                f"dataset {source.path} [{source.split}] has {total:,} samples, more than tuner scans whole "
                f"({MAX_SCAN:,}); give --max-samples N to scan a seeded random sample of N"
            )
        return ds
    if source.max_samples >= total:
        return ds
    rng = np.random.default_rng(source.seed)
    return ds.select(np.sort(rng.choice(total, size=source.max_samples, replace=False)).tolist())


# ---- the cache -------------------------------------------------------------------------------------------------


def _key(parts: list[object]) -> str:
    return hashlib.sha256(json.dumps([_CACHE_VERSION, *parts], default=str).encode()).hexdigest()[:32]


def _source_fields(source: DataSource) -> list[object]:
    return [
        source.split,
        source.input_column,
        source.target_column,
        source.text_column,
        source.max_samples,
        source.seed,
    ]


def _files_identity(path: Path) -> list[tuple[str, int, int]]:
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file() and ".cache" not in p.parts)
    return [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in files]


def _local_key(source: DataSource, tokenizer: str) -> str | None:
    """The cache key of a local dataset without loading it (None for a hub name: its fingerprint needs a load): what
    was read, by resolved path, size and modification time of every file in it (issue 33 §8: two saved datasets
    of one fingerprint are two datasets), with a saved dataset's own fingerprint beside them."""
    path = Path(source.path).expanduser()
    if not path.exists():
        return None
    if path.is_dir():
        data_files.saved_files(path)  # a saved dataset's files inside it (issue 42 §7), before any cached lengths
    ident = [data_files.saved_fingerprints(path) if path.is_dir() else None, _files_identity(path)]
    return _key(["local", ident, *_source_fields(source), _tokenizer_identity(tokenizer)])


def _tokenizer_identity(tokenizer: str) -> object:
    path = Path(tokenizer).expanduser()
    if path.is_dir():
        return [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(path.iterdir()) if p.is_file()]
    with contextlib.suppress(Exception):  # an id: the cached snapshot's path names its commit
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(tokenizer, "tokenizer_config.json")
        if isinstance(found, str):
            return [tokenizer, found]
    return [tokenizer]


def _cache_file(cache_dir: Path, key: str) -> Path:
    return cache_dir / "lengths" / f"{key}.npz"


def _read_cache(cache_dir: Path, key: str, source: DataSource, tokenizer: str) -> DataLengths | None:
    path = _cache_file(cache_dir, key)
    if not path.is_file():
        return None
    try:
        with np.load(path) as data:
            target = data["target"] if "target" in data.files else None
            lengths = SampleLengths.of(data["input"], target)
            total = int(data["total"])
    except (OSError, ValueError, KeyError):  # a torn or foreign file: read the data again
        return None
    with contextlib.suppress(OSError):
        os.utime(path)  # recently used: pruned last
    return DataLengths(lengths, source, tokenizer, total, cached=True)


def _write_cache(cache_dir: Path, key: str, lengths: SampleLengths, total: int) -> None:
    path = _cache_file(cache_dir, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp.npz")
    arrays: dict[str, Any] = {"input": lengths.input, "total": np.int64(total)}
    if lengths.target is not None:
        arrays["target"] = lengths.target
    np.savez(tmp, **arrays)
    tmp.replace(path)  # whole or absent: a reader never sees half a file
    _prune(path.parent, keep=path)


def _prune(folder: Path, keep: Path) -> None:
    """The oldest lengths files removed until the folder holds at most MAX_CACHE_BYTES (``keep`` stays)."""
    entries = []
    for entry in folder.glob("*.npz"):
        with contextlib.suppress(OSError):
            info = entry.stat()
            entries.append((info.st_mtime_ns, info.st_size, entry))
    total = sum(size for _, size, _ in entries)
    for _, size, entry in sorted(entries, key=lambda e: e[0]):
        if total <= MAX_CACHE_BYTES:
            break
        if entry != keep:
            with contextlib.suppress(OSError):
                entry.unlink()
            total -= size


__all__ = ["MAX_SCAN", "DataLengths", "DataSource", "read_lengths", "tokenizer_for"]
