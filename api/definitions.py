"""Turns a POST /studies body into the exact study definition `tuner search --study NAME` writes and resumes from
(tuner.search.request.SearchRequest.definition), so workers joining an API-created study read what they expect.

Only inline data is accepted: a local model directory names a path on the worker hosts, which this server neither
reads nor checks (it would be a path of the caller's choosing), so the API takes built-in presets and hub ids only."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from api.baseline_policy import check_posted_baseline
from api.schemas import StudyCreate
from trials.contract import BUILTIN_PREFIX, ModelSpec
from tuner.errors import ModelSourceError, TunerError
from tuner.job.model_source import resolve_model
from tuner.job.space import Space, check_job_limits, inline_space
from tuner.search.request import BaselineLoader, build_request
from tuner.units import parse_size

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


def _space(inline: dict[str, Any] | None) -> Space:
    return inline_space(inline)


def _baseline(ds_config: dict[str, Any] | None, hf_args: dict[str, Any] | None) -> BaselineLoader | None:
    """The user's current config, parsed exactly as `tuner search --baseline FILE` parses the file's content."""
    if not ds_config and not hf_args:
        return None
    check_posted_baseline(ds_config, hf_args)  # no host-acting sections, paths or absurd numbers from a remote definer

    def load(world_size: int | None, max_length: int) -> Baseline:
        from tuner.interop.baseline import parse_baseline

        return parse_baseline(ds_config, hf_args, world_size=world_size, max_length=max_length)

    return load


def _device_memory(value: int | str | None) -> int | None:
    if value is None:
        return None
    try:
        return parse_size(value)
    except TunerError as err:  # the same error, naming the field of the body
        raise type(err)(f"device_memory: {err}") from None


def definition(body: StudyCreate, storage: str) -> dict[str, Any]:
    """The study definition of ``body``, checked and derived by tuner.search.request.build_request as for the CLI."""
    request = build_request(
        study_name=body.name,
        storage=storage,
        model=_model(body.model),
        space=_space(body.space),
        budget_s=float(body.budget_s),
        world_size=body.world_size,
        global_batch=body.global_batch,
        device_memory=_device_memory(body.device_memory),
        headroom=body.headroom,
        baseline=_baseline(body.baseline, body.training_args),
        space_listed=set(body.space or {}),  # an inline space naming max_length / precision says what the job is
        length_hint="give space.max_length (your job's input length, e.g. [512]) or training_args with "
        "max_source_length / max_seq_length",
    )
    check_job_limits(request.world_size, request.global_batch)
    return request.definition()
