"""Code from a model's or tokenizer's folder never runs (issue 33 §1).

A folder whose ``config.json`` or ``tokenizer_config.json`` has an ``auto_map`` asks transformers to import its own
Python module; asked with the default ``trust_remote_code=None`` transformers prompts "Do you wish to run the custom
code? [y/N]" on tuner's terminal and imports it on "y". unless the user asked for it with
``tuner --trust-remote-code COMMAND`` (TUNER_TRUST_REMOTE_CODE=1: it reaches the probes and traces through their
environment), tuner passes ``trust_remote_code=False`` on every ``from_pretrained`` / ``from_config`` and refuses such a
folder first, in one line naming what it wants and the flag that allows it.
"""

from __future__ import annotations

from pathlib import Path

from tuner.bounded import loads_json, read_text_file
from tuner.errors import ConfigError, TunerError

#: the files transformers reads an ``auto_map`` from
CONFIG_FILES = ("config.json", "tokenizer_config.json")
REFUSAL = (
    "tuner runs no code from a model's or tokenizer's folder unless asked: `tuner --trust-remote-code COMMAND ...` "
    "(or TUNER_TRUST_REMOTE_CODE=1) runs it"
)


def trusted() -> bool:
    """Whether the user asked tuner to run a folder's own code (Settings.trust_remote_code)."""
    from tuner.settings import load_settings

    return load_settings().trust_remote_code


def _short(value: object, keep: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= keep else f"{text[:keep]}..."


def wanted_code(folder: Path) -> tuple[str, object] | None:
    """The first ``auto_map`` the folder's config files hold, as (file name, its value); None when none does."""
    for name in CONFIG_FILES:
        path = folder / name
        if not path.is_file():
            continue
        try:
            data = loads_json(read_text_file(path, name), name)
        except TunerError:  # unreadable config: transformers' own loading says so, with code refused, unless ...
            if _names_auto_map(path):  # ... a file past the read bound names one: refused here (issue 42 §9)
                return name, f"in a file too large to read whole ({path.stat().st_size:,} bytes)"
            continue
        if isinstance(data, dict) and data.get("auto_map"):
            return name, data["auto_map"]
    return None


def _names_auto_map(path: Path, limit: int = 1 << 30, chunk: int = 1 << 20) -> bool:
    """Whether the regular file ``path`` holds the key ``"auto_map"`` anywhere in its first ``limit`` bytes."""
    needle = b'"auto_map"'
    tail = b""
    try:
        if not path.is_file():
            return False
        with open(path, "rb") as fh:
            for _ in range(limit // chunk):
                block = fh.read(chunk)
                if not block:
                    return False
                if needle in tail + block:
                    return True
                tail = block[-len(needle) :]
    except OSError:
        return False
    return False


def refuse_own_code(source: str, what: str, error: type[TunerError] = ConfigError) -> None:
    """``error`` (one line) when ``source`` is a local folder that wants its own code run."""
    folder = Path(source).expanduser()
    if not folder.is_dir() or trusted():
        return
    found = wanted_code(folder)
    if found is not None:
        name, auto_map = found
        raise error(
            f"{what} {_short(str(folder))} wants its own code run ({name} auto_map {_short(auto_map)}); {REFUSAL}, "
            "else give one whose classes transformers ships (model_type / tokenizer_class of a transformers release)"
        )


def is_refusal(err: BaseException) -> bool:
    """Whether transformers refused code because ``trust_remote_code`` was False (a hub id's cached folder)."""
    return "trust_remote_code" in str(err)


__all__ = ["CONFIG_FILES", "REFUSAL", "is_refusal", "refuse_own_code", "trusted", "wanted_code"]
