"""A study's best stable config as every face hands it out: `tuner best` and `tuner export` (tuner.cli),
``tuner.best_config`` (tuner.python_api) and ``GET /best-config`` (api.views). One lookup (the study, its rows, the
best stable candidate, the baseline row), one export, one set of error texts."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property

from tuner.errors import ConfigError, NoStableConfig, StudyNotFound
from tuner.interop.export import FORMATS, ExportArgs, best_export_args, render_best
from tuner.interop.export.changes import Changes, best_changes
from tuner.records import Candidate, ProbeRow, StudyDefinition, baseline_row, failed_in_production
from tuner.records.throughput import Throughput, config_throughput, throughput
from tuner.search.selection import best_stable
from tuner.session.no_pick import why_no_pick
from tuner.session.options import api_option
from tuner.settings import redact_url
from tuner.storage import Store


@dataclass(frozen=True)
class ServedBest:
    """The best stable config of ``study`` with what every face shows of it."""

    study: str
    definition: StudyDefinition
    rows: list[ProbeRow]  # the study's probe rows, in storage order
    best: Candidate
    format: str
    transformers_version: str | None = None  # the training host's (the hf export's field names); None: this host's

    @cached_property
    def content(self) -> str:
        """The export in ``format`` (tuner.interop.export.render_best), as `tuner best` prints it."""
        return render_best(self.format, self.best, self.definition, self.transformers_version, self.study)

    @cached_property
    def export_args(self) -> ExportArgs:
        return best_export_args(self.best, self.definition, self.transformers_version)

    @cached_property
    def baseline(self) -> ProbeRow | None:
        return baseline_row(self.rows)

    @cached_property
    def throughput(self) -> Throughput:
        """The pick's figure (tuner.records.throughput: the median of its probes), as every face shows it."""
        found = throughput(self.best.rows)
        assert found is not None, "a stable candidate has a measured ok probe"
        return found

    @property
    def unit(self) -> str:
        """The study's objective unit (samples/s, or retained tokens/s when the search varied max_length)."""
        from tuner.job.objective import Objective

        return Objective.from_dict(self.definition.objective).unit

    @cached_property
    def baseline_throughput(self) -> Throughput | None:
        """The user's config's figure, the same statistic over its config's probes (None: it has no ok probe)."""
        return config_throughput(self.rows, self.baseline)

    @cached_property
    def changes(self) -> Changes:
        """What the export changes in the user's files (tuner.interop.export.changes)."""
        return best_changes(self.best, self.definition, self.baseline, self.transformers_version, self.rows)

    @cached_property
    def caveat(self) -> str | None:
        """Why the pick's figure is provisional (one line every face shows), or None when it was re-probed longer."""
        return None if self.best.confirmed else not_confirmed(self.study, self.best)

    @cached_property
    def crash_lines(self) -> list[str]:
        """With the study's data: when the baseline would crash on it, and that the pick fits its worst batch (or
        when it would crash) (tuner.session.crash_line)."""
        from tuner.session.crash_line import pick_lines, study_crash

        return pick_lines(study_crash(self.definition, self.rows), self.best.knobs, self.baseline)

    @cached_property
    def change_lines(self) -> list[str]:
        """The changes as `tuner best --changes` prints them, the pick's caveat first, and the configs no longer
        served."""
        failed = failed_in_production(self.rows)
        lines = ([self.caveat] if self.caveat else []) + self.changes.lines() + self.crash_lines
        if failed:
            lines.append(
                f"no longer served: {len(failed)} config{'s' if len(failed) > 1 else ''} whose real training run "
                "failed (see `tuner trials`)"
            )
        return lines


def best_of(rows: Iterable[ProbeRow]) -> Candidate | None:
    """The best stable config among a study's rows (tuner.search.selection's ranking), or None: what every face
    shows as the best (`tuner studies`, the report, the API's study summary), as ``serve_best`` serves it."""
    return best_stable(rows)


def check_format(fmt: str, option: Callable[[str], str] = api_option) -> None:
    if fmt not in FORMATS:
        raise ConfigError(f"unknown {option('format')} {fmt!r}; choose one of {', '.join(FORMATS)}")


def pick_study(store: Store, study: str | None) -> tuple[str, StudyDefinition]:
    """``study``'s definition, or the most recently created study's when None."""
    if study is not None:
        return study, store.require_definition(study)
    rows = store.studies()
    if not rows:
        raise StudyNotFound(f"no study in storage {redact_url(store.url)}; run `tuner search --budget 30m` first")
    return rows[0].name, rows[0].definition


def rank(store: Store, name: str) -> tuple[list[ProbeRow], Candidate | None]:
    """The study's probe rows (storage order) and their best stable candidate (tuner.search.selection.best_stable):
    what serve_best serves, and what the API caches per version of the rows."""
    rows = store.probes(name)
    return rows, best_of(rows)


def serve_best(
    store: Store,
    study: str | None,
    fmt: str = "json",
    *,
    option: Callable[[str], str] = api_option,
    ranked: tuple[list[ProbeRow], Candidate | None] | None = None,
    transformers_version: str | None = None,
) -> ServedBest:
    """The best stable config of ``study`` (the most recently created study when None) in format ``fmt``;
    ``ranked``: the study's rows and their best stable candidate when the caller has them already (the API's cache).
    StudyNotFound, NoStableConfig or an unknown format: a typed error with one line, the same for every face
    (``option`` spells the format setting as the face does)."""
    check_format(fmt, option)
    name, definition = pick_study(store, study)
    rows, found = ranked if ranked is not None else rank(store, name)
    if found is None:
        raise NoStableConfig(no_stable_config(name, rows))
    return ServedBest(name, definition, rows, found, fmt, checked_version(transformers_version, option))


def checked_version(version: str | None, option: Callable[[str], str] = api_option) -> str | None:
    """A training host's transformers version as given (None: this host's); a ConfigError when it is not one."""
    from tuner.interop.trainer_fill import checked_version as checked

    return checked(version, option)


def not_confirmed(study: str, best: Candidate) -> str:
    """The line that says a pick was never re-probed longer (the search's summary says "not confirmed")."""
    which = f"trial {best.trial_number}" if best.trial_number is not None else "this config"
    return (
        f"not confirmed: {which} was measured by short probes only, never re-probed longer; run "
        f"`tuner search --study {study}` longer to confirm it before relying on its figure"
    )


def no_stable_config(name: str, rows: list[ProbeRow]) -> str:
    ran = sum(1 for r in rows if r.measured)
    failed = failed_in_production(rows)
    why = f"; {len(failed)} whose real training run failed are no longer served" if failed else ""
    return (
        f"study {name!r} has no stable config yet ({ran} probe{'' if ran == 1 else 's'} so far{why}): "
        + why_no_pick(rows).replace("`tuner search`", f"`tuner search --study {name}`")
    )
