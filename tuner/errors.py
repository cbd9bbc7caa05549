"""Typed, user-facing errors. Each message says what is wrong and how to fix it; the CLI prints it on one line and
exits with code 2, the API answers 4xx with it. Anything else escaping is a bug."""

from __future__ import annotations


class TunerError(Exception):
    """A mistake the user can fix. ``str(err)`` is the one line shown."""

    exit_code = 2
    http_status = 400


class BudgetError(TunerError):
    pass


class SpaceError(TunerError):
    pass


class ModelSourceError(TunerError):
    pass


class BaselineError(TunerError):
    pass


class ConfigError(TunerError):
    """Contradictory or impossible options (e.g. a global batch no micro batch x world size divides)."""


class LimitError(TunerError):
    """A value past the bounds tuner accepts (a size that is not a finite integer, a space or world size too large to
    search): one line, exit 2 on the command line, HTTP 422 from the API."""

    http_status = 422


class StorageError(TunerError):
    """The storage URL is malformed, unreachable, or holds a schema this code does not understand."""

    http_status = 503


class StudyNotFound(TunerError):
    http_status = 404


class NoStableConfig(TunerError):
    http_status = 404


class NodeError(TunerError):
    """A search across nodes cannot go on: a node never joined, or one was lost and did not come back (the line names
    it and what to start)."""

    http_status = 503
