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
from tuner.job import data_files
from tuner.job.data_source import DataSource
from tuner.job.own_code import REFUSAL, is_refusal, refuse_own_code, trusted

#: data file suffix -> the `datasets` builder that reads it
BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
_BATCH = 1000


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


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

    datasets.logging.set_verbosity_error()
    logging.getLogger("datasets").setLevel(logging.ERROR)


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

    if (path / "state.json").is_file() or (path / "dataset_dict.json").is_file():
        return datasets.load_from_disk(str(path))
    if path.is_file():
        return _load_file(path, files_cache)
    if path.is_dir():
        return _load_folder(path, files_cache)
    return datasets.load_dataset(source.path)


def _refuse_empty(path: Path, source: DataSource) -> None:
    """An empty file or a saved dataset of no shards: `datasets` fails on them with no useful message."""
    state = data_files.saved_state(path) if path.is_dir() else None
    empty = (path.is_file() and path.stat().st_size == 0) or (state is not None and not state.get("_data_files"))
    if empty:
        raise ConfigError(f"dataset {source.path} [{source.split}] has no samples; give a dataset that holds data")


def _load_file(path: Path, files_cache: Path) -> Any:
    import datasets

    builder = BUILDERS.get(path.suffix.lower())
    if builder is None:
        raise ConfigError(
            f"data file {path} is not {', '.join(BUILDERS)}; give a file of one of these kinds, a folder of them, "
            "or a dataset saved with save_to_disk"
        )
    data_files.scan_files([path])
    # one file is one split, "train", as load_dataset(builder, data_files=file) names it in their script
    return datasets.load_dataset(builder, data_files={"train": str(path)}, cache_dir=str(files_cache))


def _load_folder(path: Path, files_cache: Path) -> Any:
    import datasets

    kinds = {p.suffix.lower() for p in path.iterdir() if p.is_file()} & set(BUILDERS)
    if not kinds:
        raise ConfigError(
            f"folder {path} holds no {', '.join(BUILDERS)} files and is not a dataset saved with save_to_disk"
        )
    data_files.scan_files(resolved_files(path, files_cache))
    return datasets.load_dataset(str(path), cache_dir=str(files_cache))


def resolved_files(path: Path, files_cache: Path) -> list[Path]:
    """The files `datasets` reads for the data folder ``path`` (its README's ``configs`` may name any), each
    checked to lie inside it (``data_files.inside``)."""
    import datasets

    with offline():
        builder = datasets.load_dataset_builder(str(path), cache_dir=str(files_cache))
    found = builder.config.data_files or {}
    return data_files.inside(path, sorted({str(f) for files in found.values() for f in files}))


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
    missing = [c for c in wanted if c not in ds.column_names]
    if missing:
        raise ConfigError(
            f"dataset {source.path} [{source.split}] has no column {missing[0]!r}; its columns are "
            f"{', '.join(ds.column_names)}"
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
            return [len(e.ids) for e in encode(texts, add_special_tokens=True)]
        return [len(ids) for ids in tok(texts, add_special_tokens=True)["input_ids"]]

    def lengths(batch: dict[str, list[Any]]) -> dict[str, list[int]]:
        out = {"input": encoded(batch[input_column])}
        if target_column is not None:  # through the wrapper: a tokenizer may encode labels differently
            out["target"] = [len(ids) for ids in tok(text_target=batch[target_column])["input_ids"]]
        return out

    if not progress:
        datasets.disable_progress_bars()
    try:
        mapped = ds.map(
            lengths,
            batched=True,
            batch_size=_BATCH,
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
