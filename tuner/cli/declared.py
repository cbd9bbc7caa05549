"""Command-line options built from the declared settings (tuner.declared): `tuner search`, `tuner estimate` and
`tuner explain` write none of them out. ``with_settings(face, into=...)`` gives the decorated command one typer option
per setting the records declare for the face (their help, bounds, spelling and help group), grouped in the order of
tuner.declared.PANELS (declaration order within a group) before the command's own parameters, and hands the command
the given values as one mapping (``into``)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import MISSING
from typing import Annotated, Any, TypeVar

import typer

from tuner.declared import PANELS, Declared, declared
from tuner.errors import ConfigError
from tuner.job.definition import JobFlags
from tuner.session.options import SearchOptions

F = TypeVar("F", bound=Callable[..., Any])


def _cli_type(d: Declared) -> Any:
    """What the command line reads: the declared CLI type (text for a Literal, a path for a file), made optional
    when the setting may be left out."""
    base = d.spec.cli_type if d.spec.cli_type is not None else d.type
    if d.spec.cli_type is not None and not d.required and d.default is None:
        return base | None
    return base


def parameter(d: Declared, override: Mapping[str, Any]) -> inspect.Parameter:
    """One typer option for ``d``; ``override`` holds a command's own default, help or min where its meaning
    differs (`tuner estimate` assumes a world size of 1; its global batch only decides the accumulation)."""
    option = typer.Option(
        d.flag,
        help=override.get("help", d.spec.help),
        min=override.get("min", d.spec.min),
        rich_help_panel=d.spec.panel,
    )
    value = override.get("default", d.default)
    return inspect.Parameter(
        d.name,
        inspect.Parameter.KEYWORD_ONLY,
        default=inspect.Parameter.empty if value is MISSING else value,
        annotation=Annotated[_cli_type(d), option],
    )


def _checked(d: Declared, value: Any) -> Any:
    """A Literal setting read as text (precision) checked against its choices: one line naming them."""
    choices = d.choices()
    if value is not None and choices and value not in choices:
        raise ConfigError(f"{d.flag.split('/')[0]} {value!r}: choose one of {', '.join(choices)}")
    return value


def settings_of(face: str, only: set[str] | None = None) -> list[Declared]:
    """The settings a search declares for ``face`` (SearchOptions', then JobFlags'), or ``only`` those."""
    found = declared(SearchOptions, face) + declared(JobFlags, face)
    return [d for d in found if only is None or d.name in only]


def in_panels(settings: list[Declared]) -> list[Declared]:
    """The settings grouped as a command's help shows them: by tuner.declared.PANELS, declaration order within."""
    return sorted(settings, key=lambda d: PANELS.index(d.spec.panel))


def with_settings(
    face: str,
    *,
    into: str,
    only: set[str] | None = None,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
) -> Callable[[F], F]:
    """Adds an option per declared setting of ``face`` (``only`` some; ``overrides``: a setting's default, help or
    min where this command's meaning differs) to a command taking the given values as the mapping ``into``."""
    settings = settings_of(face, only)
    overrides = overrides or {}

    def wrap(command: F) -> F:
        own = [p for p in inspect.signature(command, eval_str=True).parameters.values() if p.name != into]
        added = [parameter(d, overrides.get(d.name, {})) for d in in_panels(settings)]
        params = [*added, *(p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own)]

        def run(**given: Any) -> Any:
            values = {d.name: _checked(d, given.pop(d.name)) for d in settings}
            return command(**given, **{into: values})

        run.__name__, run.__doc__ = command.__name__, command.__doc__
        run.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in params}
        return run  # type: ignore[return-value]

    return wrap
