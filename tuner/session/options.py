"""What a user asks of a search, as given (durations, sizes, files or mappings), and its parsing into a request.

``SearchOptions`` is `tuner search`'s options and ``tuner.tune``'s keywords in one record; ``prepare_request``
parses it and hands it to tuner.search.request.build_request (the check-and-derive step ``POST /studies`` shares),
naming a setting in its messages the way the caller spells it (``cli_option``: --global-batch, ``api_option``:
global_batch).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.errors import BaselineError, ConfigError
from tuner.job.definition import JobFlags
from tuner.job.model_source import resolve_model
from tuner.job.objective import load_lengths
from tuner.job.space import Space, check_job_limits, inline_space, load_space, space_file_knobs
from tuner.records import DEFAULT_HEADROOM
from tuner.search.request import SearchRequest
from tuner.search.request import build_request as build_search_request
from tuner.search.schedule import Schedule
from tuner.settings import load_settings
from tuner.units import parse_duration, parse_size

if TYPE_CHECKING:
    from tuner.interop.baseline import Baseline

DEFAULT_MODEL = "builtin:tiny-t5"
FileOrMapping = Path | str | Mapping[str, Any]


@dataclass(frozen=True)
class SearchOptions:
    """A search as the user gives it: ``budget`` a duration ("30m") or seconds; ``space``, ``baseline`` and
    ``training_args`` files or their contents; ``lengths`` a file or token lengths; ``job_flags`` the job settings
    given on their own (--max-length, --precision, --lora-r ...). None: not given (the built-in default, or the
    files')."""

    budget: str | float
    model: str = DEFAULT_MODEL
    space: FileOrMapping | None = None
    storage: str | None = None
    study: str | None = None
    world_size: int | None = None
    device_memory: str | int | None = None
    headroom: float = DEFAULT_HEADROOM
    global_batch: int | None = None
    n_trials: int | None = None
    baseline: FileOrMapping | None = None
    training_args: FileOrMapping | None = None
    lengths: Path | str | Sequence[int] | None = None
    finalists: int = 2
    seed: int | None = None
    job_flags: JobFlags | None = None


def cli_option(name: str) -> str:
    """How `tuner search` spells a setting in a message: ``global_batch`` -> ``--global-batch``."""
    return "--" + name.replace("_", "-")


def api_option(name: str) -> str:
    """How ``tuner.tune`` spells a setting in a message: its keyword argument."""
    return name


def _space(space: FileOrMapping | None) -> tuple[Space, set[str]]:
    """The search space and the knobs it names (a file, an inline mapping, or the built-in one)."""
    if isinstance(space, Mapping):
        return inline_space(space), set(space)
    if space is None:
        return load_space(None), set()
    return load_space(space), space_file_knobs(space)


def prepare_request(
    options: SearchOptions, option: Callable[[str], str] = api_option
) -> tuple[SearchRequest, set[str]]:
    """Parses ``options`` (durations, sizes, files or mappings) and hands them to tuner.search.request.build_request,
    which checks them; returns the request plus the settings given explicitly (what a resumed study must agree on).
    ``baseline`` is your DeepSpeed JSON or training-args JSON (a file, or its contents as a mapping);
    ``training_args`` the second one."""
    o = options
    budget_s = parse_duration(o.budget) if isinstance(o.budget, str) else float(o.budget)
    if budget_s <= 0:
        raise ConfigError(f"{option('budget')} must be positive, got {o.budget!r}")
    if o.training_args is not None and o.baseline is None:
        raise BaselineError(
            f"{option('training_args')} goes with {option('baseline')} (your DeepSpeed JSON); pass both, or the "
            f"training args alone as {option('baseline')}"
        )
    parsed_space, listed = _space(o.space)
    lengths = o.lengths
    lens = load_lengths(lengths) if isinstance(lengths, (str, Path)) else list(lengths) if lengths is not None else None
    loaded: list[Baseline] = []
    request = build_search_request(
        study_name=o.study or "search-" + dt.datetime.now().strftime("%Y%m%d-%H%M%S"),
        storage=load_settings(storage=o.storage).storage,
        model=resolve_model(o.model),
        space=parsed_space,
        budget_s=budget_s,
        world_size=o.world_size,
        global_batch=o.global_batch,
        device_memory=parse_size(o.device_memory) if o.device_memory is not None else None,
        headroom=o.headroom,
        n_trials=o.n_trials,
        baseline=_baseline_loader(o.baseline, o.training_args, loaded) if o.baseline is not None else None,
        lengths=lens,
        schedule=Schedule(finalists=max(o.finalists, 0)),
        seed=o.seed,
        option=option,
        job_flags=o.job_flags,
        space_listed=listed,
    )
    # the 64-rank and global-batch caps (the GPUs this host shows: check_world_size, before the study is written)
    check_job_limits(request.world_size, request.global_batch, option)
    if request.job is not None and request.job.lora is not None:  # its target modules are in the model, peft runs
        from tuner.job.lora import check_lora

        check_lora(request.model, request.job.lora, option)
    return request, explicit_settings(o, baseline_world=loaded[-1].world_size if loaded else None)


def explicit_settings(o: SearchOptions, baseline_world: int | None) -> set[str]:
    """The definition fields the user set (a resumed study's stored ones must agree): given options, and what the
    baseline files decide (their world size, global batch and job)."""
    given = {
        "model": o.model != DEFAULT_MODEL,
        "space": o.space is not None,
        "world_size": o.world_size is not None or baseline_world is not None,
        "global_batch": o.global_batch is not None or o.baseline is not None,
        "device_memory": o.device_memory is not None,
        "objective": o.lengths is not None,
        "job": o.baseline is not None or (o.job_flags is not None and o.job_flags != JobFlags()),
        "headroom": o.headroom != DEFAULT_HEADROOM,
        "baseline": o.baseline is not None,
    }
    return {key for key, set_ in given.items() if set_}


def _baseline_loader(
    baseline: FileOrMapping, training_args: FileOrMapping | None, loaded: list[Baseline]
) -> Callable[[int | None, int], Baseline]:
    """Parses the user's files for a world size and the longest length (build_request calls it once it knows
    them), keeping the parsed baseline in ``loaded``."""

    def load(world: int | None, max_length: int) -> Baseline:
        from tuner.interop.baseline import parse_baseline
        from tuner.interop.baseline_files import file_kind, load_baseline, read_json

        if not isinstance(baseline, Mapping) and not isinstance(training_args, Mapping):
            args_path = Path(training_args) if training_args is not None else None
            loaded.append(load_baseline(Path(baseline), args_path, world_size=world, max_length=max_length))
            return loaded[-1]
        first = dict(baseline) if isinstance(baseline, Mapping) else read_json(Path(baseline), "baseline file")
        second = None
        if training_args is not None:
            second = (
                dict(training_args)
                if isinstance(training_args, Mapping)
                else read_json(Path(training_args), "training-args file")
            )
        ds, hf = (first, second) if file_kind(first) == "deepspeed" else (None, first)
        if second is not None and ds is None:
            raise BaselineError("two training-args given; pass one DeepSpeed JSON and one training-args JSON")
        loaded.append(parse_baseline(ds, hf, world_size=world, max_length=max_length))
        return loaded[-1]

    return load
