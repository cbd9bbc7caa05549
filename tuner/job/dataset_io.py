"""The side of reading a dataset that touches `datasets` and `transformers`: load a split, check its columns, load
the tokenizer offline, tokenize to lengths. Imported only when the lengths are not cached (both imports are slow).
Each failure is one ConfigError naming the fix."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tuner.errors import ConfigError
from tuner.job import data_files, data_formats, data_stream
from tuner.job.data_columnar import decoded_lengths
from tuner.job.data_source import DataSource
from tuner.job.own_code import REFUSAL, is_refusal, refuse_own_code, trusted

#: data file suffix -> the `datasets` builder that reads it
BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
_BATCH = 1000  # samples a tokenizing batch holds at most
#: text bytes a tokenizing batch holds at most, all workers together: a fast tokenizer's encodings cost ~400 bytes a
#: token (4 MiB of one-word tokens ~570 MB), so 1,000 samples of a few MiB would pass 4 GB (issue 42 §5)
TOKENIZE_BATCH_BYTES = 2 << 20
#: a saved dataset is memory-mapped where it lies, not copied into tuner's cache: validated, not bounded in size
SAVED_BYTES = 1 << 50
SAVED_ROWS = 1 << 40


def _first_line(err: BaseException, keep: int = 300) -> str:
    """The first line of ``err`` (of its cause, for `datasets`' "An error occurred while generating the dataset"),
    cut to ``keep`` characters."""
    if type(err).__name__ == "DatasetGenerationError" and err.__cause__ is not None:
        err = err.__cause__
    text = str(err).strip().splitlines()
    line = text[0] if text else type(err).__name__
    return line if len(line) <= keep else f"{line[:keep]}..."


#: (module, attribute) -> the value inside ``offline()``: the library constants the environment variables
#: HF_HUB_OFFLINE, HF_DATASETS_OFFLINE, HF_UPDATE_DOWNLOAD_COUNTS and HF_HUB_DISABLE_TELEMETRY set at import time
_OFFLINE = (
    ("datasets.config", "HF_HUB_OFFLINE", True),
    ("datasets.config", "HF_DATASETS_OFFLINE", True),
    ("datasets.config", "HF_UPDATE_DOWNLOAD_COUNTS", False),
    ("huggingface_hub.constants", "HF_HUB_OFFLINE", True),
    ("huggingface_hub.constants", "HF_HUB_DISABLE_TELEMETRY", True),
)


@contextlib.contextmanager
def offline() -> Iterator[None]:
    """The one place tuner keeps `datasets`, transformers and the hub client off the network while it reads the
    user's data or tokenizer (issue 33 §9): no download-count request for a local file, no Hub call for an id (it
    must already be in the local cache). The constants are set for the block and restored after, since both
    libraries read their environment variables once, at import."""
    import importlib

    saved = []
    for module_name, attr, value in _OFFLINE:
        module = importlib.import_module(module_name)
        if hasattr(module, attr):
            saved.append((module, attr, getattr(module, attr)))
            setattr(module, attr, value)
    try:
        yield
    finally:
        for module, attr, value in reversed(saved):
            setattr(module, attr, value)


def _quiet() -> None:
    import datasets

    datasets.logging.set_verbosity(logging.CRITICAL)  # its read errors are said once, in tuner's one line
    logging.getLogger("datasets").setLevel(logging.CRITICAL)


def load_split(source: DataSource, files_cache: Path, progress: bool = True) -> Any:
    """The split as a `datasets.Dataset` (``progress``: `datasets`' own bars on stderr while it builds)."""
    import datasets

    _quiet()
    path = Path(source.path).expanduser()
    _refuse_empty(path, source)
    if not progress:
        datasets.disable_progress_bars()
    try:
        with offline():
            loaded = _load(path, source, files_cache)
    except ConfigError:
        raise
    except Exception as err:  # `datasets` raises many kinds; each becomes one line
        where = (
            "" if path.exists() else " (not a local path, nor a hub dataset in the local cache: tuner reads offline)"
        )
        raise ConfigError(f"dataset {source.path} could not be read{where}: {_first_line(err)}") from None
    finally:
        if not progress:
            datasets.enable_progress_bars()
    return _pick_split(loaded, source)


def _load(path: Path, source: DataSource, files_cache: Path) -> Any:
    import datasets

    columns = [c for c in source.columns() if c is not None]
    saved = data_files.saved_files(path) if path.is_dir() else None
    if saved is not None:  # memory-mapped where it lies: validated, not bounded by tuner's cache; the split's own
        # columns are checked once it is picked (another split may lack the target column)
        data_formats.plan("arrow", saved, [], f"saved dataset {path}", limit=SAVED_BYTES, rows=SAVED_ROWS)
        return datasets.load_from_disk(str(path))
    if path.is_file():
        return _load_file(path, columns, files_cache)
    if path.is_dir():
        return _load_folder(path, columns, files_cache)
    return datasets.load_dataset(source.path)


def _refuse_empty(path: Path, source: DataSource) -> None:
    """An empty file or a saved dataset of no shards: `datasets` fails on them with no useful message; a pipe or
    device is no dataset (and no hub name to look up)."""
    if path.exists() and not path.is_file() and not path.is_dir():
        raise ConfigError(
            f"dataset {data_stream.shown(source.path)} is not a regular file or folder; give a data file, a folder of "
            "them or a dataset saved with save_to_disk (tuner reads no pipes or devices)"
        )
    state = data_files.saved_state(path) if path.is_dir() else None
    empty = (path.is_file() and path.stat().st_size == 0) or (state is not None and not state.get("_data_files"))
    if empty:
        raise ConfigError(f"dataset {source.path} [{source.split}] has no samples; give a dataset that holds data")


def _load_file(path: Path, columns: list[str], files_cache: Path) -> Any:
    import datasets

    builder = data_formats.one_file_builder(path, BUILDERS)
    plan = data_formats.plan(builder, [path], columns, f"data file {path}")
    # one file is one split, "train", as load_dataset(builder, data_files=file) names it in their script
    return datasets.load_dataset(builder, data_files={"train": str(path)}, cache_dir=str(files_cache), **plan.kwargs)


def _load_folder(path: Path, columns: list[str], files_cache: Path) -> Any:
    import datasets

    kinds = {p.suffix.lower() for p in path.iterdir() if p.is_file()} & set(BUILDERS)
    if not kinds:
        raise ConfigError(
            f"folder {path} holds no {', '.join(BUILDERS)} files and is not a dataset saved with save_to_disk"
        )
    builder, files = resolved_files(path, files_cache)
    plan = data_formats.plan(builder, files, columns, f"data folder {path}")
    return datasets.load_dataset(str(path), cache_dir=str(files_cache), **plan.kwargs)


def resolved_files(path: Path, files_cache: Path) -> tuple[str, list[Path]]:
    """The format `datasets` reads the data folder ``path`` as, and the files it reads (its README's ``configs``
    may name any), each checked to lie inside it (``data_files.inside``)."""
    import datasets

    data_files.readme_front_matter(path)
    with offline():
        builder = datasets.load_dataset_builder(str(path), cache_dir=str(files_cache))
    found = builder.config.data_files or {}
    return builder.name, data_files.inside(path, sorted({str(f) for files in found.values() for f in files}))


def _pick_split(loaded: Any, source: DataSource) -> Any:
    import datasets

    if isinstance(loaded, datasets.Dataset):
        if source.split != "train":
            raise ConfigError(
                f"dataset {source.path} is one split with no name; give --split train (the default), or a dataset "
                "with named splits"
            )
        return loaded
    splits = list(loaded.keys())
    if source.split not in splits:
        raise ConfigError(
            f"dataset {source.path} has no split {source.split!r}; give --split one of {', '.join(splits)}"
        )
    return loaded[source.split]


def check_columns(ds: Any, source: DataSource, wanted: list[str]) -> None:
    """Each of ``wanted`` is a column of ``ds`` holding one string per sample (a ``[str, str]`` column would be
    tokenized as a sentence pair, a list as many texts: issue 42 §10)."""
    missing = [c for c in wanted if c not in ds.column_names]
    if missing:
        raise ConfigError(
            f"dataset {source.path} [{source.split}] has no column {missing[0]!r}; its columns are "
            f"{', '.join(str(c)[:80] for c in ds.column_names[:20])}"
        )
    for column in wanted:
        feature = ds.features[column]
        if getattr(feature, "dtype", None) not in ("string", "large_string"):
            raise ConfigError(
                f"dataset {source.path} [{source.split}] column {column!r} holds {str(feature)[:80]}, not text; "
                "tuner tokenizes a column of one string per sample (a pair or a list is not one text)"
            )


def load_tokenizer(tokenizer: str) -> Any:
    """``AutoTokenizer`` from an id (local cache only) or a save_pretrained directory."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    refuse_own_code(tokenizer, "tokenizer")
    try:
        with offline():
            return AutoTokenizer.from_pretrained(tokenizer, local_files_only=True, trust_remote_code=trusted())
    except Exception as err:  # OSError, ValueError, ImportError ...: each becomes one line
        if is_refusal(err):
            raise ConfigError(f"tokenizer {tokenizer} wants its own code run; {REFUSAL}") from None
        raise ConfigError(
            f"tokenizer {tokenizer} cannot be loaded offline ({_first_line(err)}); give --tokenizer a directory "
            "saved with save_pretrained, or an id in the local Hugging Face cache"
        ) from None


def _trim() -> None:
    """Hands freed heap memory back to the system (glibc's malloc_trim): a MiB sample's encoding is ~400 bytes a
    token, and the heap otherwise keeps each batch's high-water mark; elsewhere, nothing."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)


def batch_size(ds: Any, columns: list[str], workers: int) -> int:
    """Samples per tokenizing batch: ``TOKENIZE_BATCH_BYTES`` (shared by the workers) of the widest sample's text
    (over the whole table, an upper bound when a sample of it is read), at least 1, at most ``_BATCH``."""
    widest = np.zeros(len(ds.data), dtype=np.int64)
    for column in columns:
        widest += decoded_lengths(ds.data.column(column))
    return max(1, min(_BATCH, TOKENIZE_BATCH_BYTES // workers // max(1, int(widest.max(initial=1)))))


def token_lengths(
    ds: Any, tok: Any, input_column: str, target_column: str | None, num_proc: int | None, progress: bool, key: str
) -> tuple[np.ndarray, np.ndarray | None]:
    """Tokens per sample (special tokens included, no truncation), inputs and targets, by a batched map."""
    import datasets

    backend = getattr(tok, "backend_tokenizer", None)  # a fast tokenizer's Rust core: no offsets, no masks built
    if backend is not None:
        backend.no_truncation()  # as the wrapper's call without truncation=True
        backend.no_padding()

    def encoded(texts: list[str]) -> list[int]:
        if backend is not None:
            encode = getattr(backend, "encode_batch_fast", backend.encode_batch)  # _fast: tokenizers >= 0.21
            return [len(e) for e in encode(texts, add_special_tokens=True)]  # len(): no list of ids built
        return [len(ids) for ids in tok(texts, add_special_tokens=True)["input_ids"]]

    def lengths(batch: dict[str, list[Any]]) -> dict[str, list[int]]:
        out = {"input": encoded(batch[input_column])}
        if target_column is not None:  # through the wrapper: a tokenizer may encode labels differently
            out["target"] = [len(ids) for ids in tok(text_target=batch[target_column])["input_ids"]]
        if len(batch[input_column]) < _BATCH:  # samples of MiBs: the tokenizer's freed memory back to the system
            _trim()
        return out

    import pyarrow as pa

    pa.default_memory_pool().release_unused()  # what reading the files left in pyarrow's pool
    _trim()
    texts = [input_column] + ([target_column] if target_column is not None else [])
    ds = ds.select_columns(texts)  # a batch holds the text columns only (no copy: a view of the same table)
    if not progress:
        datasets.disable_progress_bars()
    try:
        mapped = ds.map(
            lengths,
            batched=True,
            batch_size=batch_size(ds, texts, num_proc or 1),
            num_proc=num_proc,
            remove_columns=ds.column_names,
            keep_in_memory=True,  # never writes cache files beside the user's saved dataset
            new_fingerprint=key,  # hashing the tokenizer to fingerprint the function is slow
            desc="tokenizing",
        )
    except (ValueError, TypeError) as err:
        columns = input_column + (f" and {target_column}" if target_column else "")
        raise ConfigError(
            f"dataset {ds.info.dataset_name or ''} column {columns} could not be tokenized ({_first_line(err)}); "
            "give columns that hold text"
        ) from None
    finally:
        if not progress:
            datasets.enable_progress_bars()
    arrays = mapped.with_format("numpy")
    inputs = np.asarray(arrays["input"], dtype=np.int64)
    targets = np.asarray(arrays["target"], dtype=np.int64) if target_column is not None else None
    return inputs, targets
