"""One declaration per setting a user gives a search, and the faces built from it.

A setting is a field of a typed record (tuner.session.options.SearchOptions, tuner.job.definition.JobFlags) declared
with ``setting(help, default, ...)``: its name, type and default are the field's; its help, its least value, how
each face spells it and the help group it is shown in are the field's metadata. The faces read the declarations
(``declared(record, face)``) instead of writing the settings again: the options of `tuner search`, `tuner estimate`
and `tuner explain` (tuner.cli.declared), the keywords and docstring of ``tuner.tune`` (tuner.python_api), the body
of ``POST /studies`` (api.schemas.StudyCreate).

Pure: no typer, no pydantic, no I/O.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field
from typing import Any, Literal, get_args, get_origin

#: the faces a setting can appear on
SEARCH = "search"  # `tuner search`
ESTIMATE = "estimate"  # `tuner estimate`
EXPLAIN = "explain"  # `tuner explain`: the job as a search reads it, without what only a search uses (a budget ...)
TUNE = "tune"  # tuner.tune(...)
API = "api"  # the body of POST /studies
EVERY_SEARCH_FACE = frozenset({SEARCH, TUNE, API})
KEY = "tuner.setting"

#: the groups a command's help shows its options in (typer's rich_help_panel), in this order
JOB_PANEL = "Your job"  # what stays fixed: model, ranks and their memory, global batch, your files, lengths, eval
DATA_PANEL = "Your data"  # the dataset the job's lengths and batches come from
SEARCH_PANEL = "Search"  # what is searched and within what: budget, space, headroom, trials
STORAGE_PANEL = "Storage"  # where studies live, and which one
OUTPUT_PANEL = "Output"  # what is printed or written
PANELS = (JOB_PANEL, DATA_PANEL, SEARCH_PANEL, STORAGE_PANEL, OUTPUT_PANEL)


@dataclass(frozen=True)
class Spec:
    """What a face needs to know of a setting beyond its name, type and default."""

    help: str
    faces: frozenset[str] = EVERY_SEARCH_FACE
    min: int | None = None  # the least value: the command line and the API body refuse less
    flag: str | None = None  # the command line's spelling when not --name-with-dashes ("--generate/--no-generate")
    cli_type: Any = None  # what the command line reads, when not the keyword's type (a file path, text)
    api_type: Any = None  # what the API body takes, when not the keyword's type (inline data, never a path)
    api_help: str | None = None  # the API body's description, where its form differs (inline data, not a file)
    api: Mapping[str, Any] = field(default_factory=dict)  # further bounds of the API body's field (le=..., max_length)
    panel: str = JOB_PANEL  # the group a command's help shows it in (PANELS)


def setting(help: str, default: Any = MISSING, **spec: Any) -> Any:
    """A dataclass field declaring one setting (no ``default``: required)."""
    return field(default=default, metadata={KEY: Spec(help, **spec)})


@dataclass(frozen=True)
class Declared:
    """One declared setting, as a face reads it."""

    name: str
    type: Any  # the keyword's annotation (tune(), the record's field)
    default: Any  # dataclasses.MISSING: required
    spec: Spec

    @property
    def required(self) -> bool:
        return self.default is MISSING

    @property
    def flag(self) -> str:
        """The command line's spelling: ``global_batch`` -> ``--global-batch``."""
        return self.spec.flag or "--" + self.name.replace("_", "-")

    def choices(self) -> tuple[str, ...]:
        """The values of a setting typed as a Literal (precision: bf16, fp16, fp32); () for any other."""
        for arm in (self.type, *get_args(self.type)):
            if get_origin(arm) is Literal:
                return tuple(str(a) for a in get_args(arm))
        return ()


def declared(record: type, face: str) -> list[Declared]:
    """The settings ``record`` declares for ``face``, in declaration order. A field without a declaration (a nested
    record such as SearchOptions.job_flags) is left to the caller."""
    hints = typing.get_type_hints(record)
    out: list[Declared] = []
    for f in dataclasses.fields(record):
        spec = f.metadata.get(KEY)
        if isinstance(spec, Spec) and face in spec.faces:
            out.append(Declared(f.name, hints[f.name], f.default, spec))
    return out


__all__ = [
    "API",
    "DATA_PANEL",
    "ESTIMATE",
    "EXPLAIN",
    "JOB_PANEL",
    "OUTPUT_PANEL",
    "PANELS",
    "SEARCH",
    "SEARCH_PANEL",
    "STORAGE_PANEL",
    "TUNE",
    "Declared",
    "Spec",
    "declared",
    "setting",
]
