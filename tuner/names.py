"""Study names (one rule for `tuner search --study`, ``tuner.tune`` and the API) and stored text made safe to print.

A name is 1-128 characters of letters, digits, ``.``, ``_`` and ``-``, not only dots (``.`` and ``..`` read as paths
in a URL: ``GET /studies/%2e%2e``). Text read back from storage (names, causes, messages) may have been written by an
older tuner or by hand: ``printable`` drops C0/C1 control characters (ESC sequences, newlines) before it is shown.
"""

from __future__ import annotations

import re

from tuner.errors import ConfigError

STUDY_NAME_MAX = 128
# letters, digits, . _ -, with at least one that is not a dot (pydantic's regex engine has no lookahead)
STUDY_NAME_PATTERN = r"^[A-Za-z0-9._-]*[A-Za-z0-9_-][A-Za-z0-9._-]*$"
_NAME = re.compile(STUDY_NAME_PATTERN)
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def check_study_name(name: str, option: str = "--study") -> str:
    """``name`` when it is a valid study name; else one line naming the rule."""
    if len(name) > STUDY_NAME_MAX or not _NAME.match(name):
        shown = printable(name)
        shown = shown if len(shown) <= 60 else f"{shown[:60]}... ({len(name)} characters)"
        raise ConfigError(
            f"{option} {shown!r} is not a study name: 1-{STUDY_NAME_MAX} letters, digits, '.', '_' or '-', not only "
            "dots"
        )
    return name


def printable(text: str) -> str:
    """``text`` without C0/C1 control characters (a newline or tab becomes a space)."""
    return _CONTROL.sub(lambda m: " " if m.group() in "\n\r\t" else "", text)


__all__ = ["STUDY_NAME_MAX", "STUDY_NAME_PATTERN", "check_study_name", "printable"]
