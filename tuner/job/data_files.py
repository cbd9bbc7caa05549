"""The user's data files checked before `datasets` reads them (issue 33 §7, §8; issue 42 §7): pure but for the reads.

- A saved dataset's ``state.json`` / ``dataset_dict.json`` / ``dataset_info.json`` is read as a bounded JSON object
  (not JSON, a list, not UTF-8: one line, not a traceback), and the files it names (``_data_files``, a dict's
  ``splits``) must lie inside the folder given, as every other data file: `datasets` joins them to the folder, so
  ``../`` or an absolute path would be read from elsewhere, and the lengths cache, keyed by the folder's files, would
  serve a changed outside file's old lengths.
- A data folder's files are the ones `datasets` resolves (its README's ``configs`` may name any path): each must lie
  inside the folder given, or the job line would name one folder while the lengths come from another.

The formats themselves are measured by tuner.job.data_formats.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tuner.bounded import loads_json, read_text_file
from tuner.bounded_yaml import loads_yaml
from tuner.errors import ConfigError
from tuner.job.data_stream import shown as _name


def inside(folder: Path, files: Iterable[str]) -> list[Path]:
    """The resolved ``files``; ConfigError when one lies outside ``folder`` (``../``, an absolute path, a link)."""
    root = folder.resolve()
    out = []
    for name in files:
        try:
            resolved = Path(name).resolve()
        except (OSError, ValueError, RuntimeError):  # a NUL byte, a link loop
            raise ConfigError(f"data folder {_name(folder)} names a file tuner cannot resolve: {_name(name)}") from None
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


def _state_files(split: Path, state: dict[str, Any], root: Path) -> list[Path]:
    """The arrow files a saved split's ``state`` names (``_data_files``), each inside ``root``."""
    entries = state.get("_data_files")
    if not isinstance(entries, list) or not all(
        isinstance(e, dict) and isinstance(e.get("filename"), str) for e in entries
    ):
        raise ConfigError(
            f"saved dataset state {_name(split / 'state.json')} does not list its files (_data_files); save the "
            "dataset again with save_to_disk"
        )
    if (split / "dataset_info.json").is_file():
        _json_object(split / "dataset_info.json", "saved dataset info")
    return inside(root, [str(split / e["filename"]) for e in entries])


def saved_files(folder: Path) -> list[Path] | None:
    """The arrow files `datasets.load_from_disk` reads for the saved Dataset or DatasetDict at ``folder``, each
    checked to lie inside it; None when ``folder`` is not a saved dataset."""
    state = saved_state(folder)
    if state is not None:
        return _state_files(folder, state, folder)
    if not (folder / "dataset_dict.json").is_file():
        return None
    splits = _json_object(folder / "dataset_dict.json", "saved dataset dict").get("splits")
    if not isinstance(splits, list) or not all(isinstance(s, str) for s in splits):
        raise ConfigError(
            f"saved dataset dict {_name(folder / 'dataset_dict.json')} does not list its splits; save the dataset "
            "again with save_to_disk"
        )
    files: list[Path] = []
    for split in splits:
        where = inside(folder, [str(folder / split)])[0]
        split_state = saved_state(where)
        if split_state is None:
            raise ConfigError(f"saved dataset {_name(folder)} has no split folder {split[:80]!r} with a state.json")
        files += _state_files(where, split_state, folder)
    return files


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


def readme_front_matter(folder: Path) -> None:
    """A data folder's README.md, whose YAML front matter `datasets` parses with PyYAML's pure-Python loader (its
    ``configs`` name the files): read within tuner's bounds first (4 MiB; aliases counted expanded), one line if not."""
    readme = folder / "README.md"
    if not readme.exists():
        return
    text = read_text_file(readme, "data folder README")
    if text.startswith("---"):
        front = text[3:].split("\n---", 1)[0]
        loads_yaml(front, f"data folder README {_name(readme)} front matter")


__all__ = ["inside", "readme_front_matter", "saved_files", "saved_fingerprints", "saved_state"]
