"""Turns a POST /studies body into the exact study definition `tuner search --study NAME` writes and resumes from
(tuner.search.request.SearchRequest.definition), so workers joining an API-created study read what they expect: the
body is a search's options (tuner.session.options.SearchOptions), prepared by the same code as the CLI's through the
API's ``Face``.

Only inline data is accepted: a local model directory names a path on the worker hosts, which this server neither
reads nor checks (it would be a path of the caller's choosing), so the API takes built-in presets and hub ids only."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from api.baseline_policy import check_posted_baseline
from api.schemas import StudyCreate
from trials.contract import BUILTIN_PREFIX, ModelSpec
from tuner.errors import ModelSourceError
from tuner.interop.trainer_fill import checked_version
from tuner.job.model_source import resolve_model
from tuner.session.options import Face, SearchOptions, prepare_request

if TYPE_CHECKING:
    from tuner.interop.baseline import Baseline

HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?$")


def _model(source: str) -> ModelSpec:
    source = source.strip()
    if source.startswith(BUILTIN_PREFIX):
        return resolve_model(source)  # preset names only: no filesystem access
    if not HUB_ID.match(source) or ".." in source:
        raise ModelSourceError(
            f"model {source!r}: the API takes builtin:<preset> or a hub id like google/flan-t5-large; for a local "
            "model directory run `tuner search --model DIR --study NAME` on the worker host"
        )
    return ModelSpec(source=source)


def _baseline(
    o: SearchOptions, option: Callable[[str], str], loaded: list[Baseline]
) -> Callable[[int | None, int], Baseline] | None:
    """The user's current config, parsed exactly as `tuner search --baseline FILE` parses the file's content:
    ``baseline`` their DeepSpeed JSON, ``training_args`` their training args (alone or with it)."""
    ds, hf = _mapping(o.baseline), _mapping(o.training_args)
    if not ds and not hf:
        return None
    check_posted_baseline(ds, hf)  # no host-acting sections, paths or absurd numbers from a remote definer
    version = checked_version(o.transformers_version, option)

    def load(world_size: int | None, max_length: int) -> Baseline:
        from tuner.interop.baseline import parse_baseline

        loaded.append(
            parse_baseline(ds, hf, world_size=world_size, max_length=max_length, transformers_version=version)
        )
        return loaded[-1]

    return load


def _mapping(value: object) -> dict[str, Any] | None:
    return dict(value) if isinstance(value, Mapping) else None


#: how the API reads a body: hub ids and presets only, the baseline inline and checked, settings named as in the body
API_FACE = Face(
    model=_model,
    baseline=_baseline,
    length_hint="give max_length (your job's input length, e.g. 512), space.max_length or training_args with "
    "max_source_length / max_seq_length",
)


def definition(body: StudyCreate, storage: str) -> dict[str, Any]:
    """The study definition of ``body``: its settings are a search's (tuner.session.options.SearchOptions), checked
    and derived by the same tuner.session.options.prepare_request as for `tuner search` and ``tuner.tune``."""
    settings = body.model_dump(exclude={"name", "budget_s"})
    options = SearchOptions.of({**settings, "budget": float(body.budget_s), "study": body.name, "storage": storage})
    request, _ = prepare_request(options, storage, API_FACE)
    return request.definition()
