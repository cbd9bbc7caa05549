"""What a user asks of a search, as given (durations, sizes, files or mappings), and its parsing into a request.

``SearchOptions`` is the one declaration of a search's settings (tuner.declared): `tuner search`'s options,
``tuner.tune``'s keywords and the body of ``POST /studies`` are built from its fields and JobFlags'.
``prepare_request`` parses it and hands it to tuner.search.request.build_request (the check-and-derive step); a
``Face`` says how the front door that asked reads a model and a baseline and spells a setting in its messages
(``CLI``: --global-batch, ``PYTHON``: global_batch; the API's in api.definitions).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trials.contract import ModelSpec
from tuner.declared import API, ESTIMATE, EVERY_SEARCH_FACE, SEARCH, TUNE, setting
from tuner.errors import BaselineError, ConfigError, TunerError
from tuner.job.definition import JobFlags
from tuner.job.inline_data import MAX_INLINE_SAMPLES, InlineLengths, inline_data
from tuner.job.model_source import resolve_model
from tuner.job.objective import load_lengths
from tuner.job.padding import Padding
from tuner.job.space import (
    MAX_GLOBAL_BATCH,
    MAX_WORLD_SIZE,
    Space,
    check_job_limits,
    inline_space,
    load_space,
    space_file_knobs,
)
from tuner.names import check_study_name
from tuner.records import DEFAULT_HEADROOM
from tuner.search.request import BaselineLoader, SearchRequest
from tuner.search.request import build_request as build_search_request
from tuner.search.schedule import Schedule
from tuner.units import parse_duration, parse_size

if TYPE_CHECKING:
    from tuner.interop.baseline import Baseline
    from tuner.job.data_job import DataJob

DEFAULT_MODEL = "builtin:tiny-t5"
FileOrMapping = Path | str | Mapping[str, Any]
_LOCAL = frozenset({SEARCH, TUNE})  # settings of one run on this host (files, a budget, a seed), not of a study
_ESTIMATED = EVERY_SEARCH_FACE | {ESTIMATE}  # `tuner estimate` has them too
_DATA = _LOCAL | {ESTIMATE}  # the user's data: read on this host (POST /studies takes no server path)


@dataclass(frozen=True)
class SearchOptions:
    """A search as the user gives it: ``budget`` a duration ("30m") or seconds; ``space``, ``baseline`` and
    ``training_args`` files or their contents; ``lengths`` a file or token lengths; ``job_flags`` the job settings
    given on their own (--max-length, --precision, --lora-r ...). None: not given (the built-in default, or the
    files'). Each field's declaration (tuner.declared.setting) is what every face shows of it."""

    budget: str | float = setting(
        "wall-clock budget for the whole search: 90s, 30m, 2h, 1h30m", cli_type=str, faces=_LOCAL
    )
    model: str = setting(
        "builtin:tiny-t5, an HF model id, or a local model directory",
        DEFAULT_MODEL,
        faces=_ESTIMATED,
        api_help="builtin:<preset> or an HF model id (a local model directory: run the worker with --model DIR)",
        api={"max_length": 512},
    )
    space: FileOrMapping | None = setting(
        "search space YAML/TOML (default: built-in)",
        None,
        cli_type=Path,
        api_type=dict[str, Any] | None,
        api_help="inline search space over the default (knob -> choices)",
    )
    storage: str | None = setting(
        "SQLAlchemy URL (default: $TUNER_STORAGE or sqlite:///tuner.db)", None, faces=_LOCAL | {ESTIMATE}
    )
    study: str | None = setting("study name; an existing one is resumed", None, faces=_LOCAL)
    world_size: int | None = setting(
        "ranks per probe (data-parallel GPUs)", None, faces=_ESTIMATED, api={"ge": 1, "le": MAX_WORLD_SIZE}
    )
    device_memory: str | int | None = setting(
        "memory per rank, e.g. 80GiB (default: the device's)", None, cli_type=str, faces=_ESTIMATED
    )
    headroom: float = setting("stable = peak <= headroom x device memory", DEFAULT_HEADROOM, api={"gt": 0, "le": 1})
    global_batch: int | None = setting(
        "samples per optimizer step, held fixed", None, faces=_ESTIMATED, api={"ge": 1, "le": MAX_GLOBAL_BATCH}
    )
    n_trials: int | None = setting("stop exploring after this many probes", None, faces=_LOCAL)
    baseline: FileOrMapping | None = setting(
        "your current DeepSpeed JSON, HF training-args JSON or accelerate config (FSDP); probed first",
        None,
        faces=_ESTIMATED,
        cli_type=Path,
        api_type=dict[str, Any] | None,
        api_help="your current DeepSpeed config (HF 'auto' values allowed), probed first as trial 0",
    )
    lengths: Path | str | Sequence[int] | None = setting(
        "file of your samples' token lengths (retained-token objective)", None, cli_type=Path, faces=_LOCAL
    )
    finalists: int = setting("best stable configs re-probed longer before the pick", 2, faces=_LOCAL)
    seed: int | None = setting("sampler seed", None, faces=_LOCAL)
    training_args: FileOrMapping | None = setting(
        "your training-args JSON, with --baseline DS_JSON (or name it inside) or an accelerate config",
        None,
        faces=_ESTIMATED,
        cli_type=Path,
        api_type=dict[str, Any] | None,
        api_help="your current HF TrainingArguments as JSON (alone or with `baseline`)",
    )
    transformers_version: str | None = setting(
        "the transformers release your training runs on (default: this host's): the baseline's 'auto' values are "
        "filled as its Trainer fills them, and the exports written for it",
        None,
        api_help="the transformers release your training runs on (default: the worker's): the baseline's 'auto' "
        "values are filled as its Trainer fills them, e.g. 5.17.0",
    )
    estimate: bool | None = setting(
        "skip configs a memory trace predicts far over budget (default: on for budgets of 10 minutes or more)",
        None,
        flag="--estimate/--no-estimate",
        faces=_LOCAL,
    )
    # the user's data (tuner.job.dataset): the job's lengths and batches come from it
    dataset: str | None = setting(
        "your training data: a save_to_disk folder, a JSON-lines/JSON/CSV/Parquet file or folder, or a hub dataset "
        "in your local cache; the job's lengths are its samples'",
        None,
        faces=_DATA,
    )
    split: str = setting("the dataset's training split", "train", faces=_DATA)
    eval_split: str | None = setting("the dataset's eval split (its lengths are shown)", None, faces=_DATA)
    input_column: str | None = setting("seq2seq input text column of --dataset", None, faces=_DATA)
    target_column: str | None = setting("seq2seq label text column of --dataset", None, faces=_DATA)
    text_column: str | None = setting("causal LM text column of --dataset", None, faces=_DATA)
    tokenizer: str | None = setting(
        "tokenizer id or directory for --dataset (default: the model's own; built-in presets have none)",
        None,
        faces=_DATA,
    )
    padding: Padding = setting(
        "how your collator pads: longest (per batch, the Trainer's default) or max_length",
        "longest",
        cli_type=str,
        faces=_DATA,
    )
    max_samples: int | None = setting(
        "scan a seeded random sample of this many samples of --dataset", None, min=1, faces=_DATA
    )
    sample_lengths: Sequence[Sequence[int]] | Sequence[int] | None = setting(
        "your data's per-sample token lengths, as `tuner lengths --dataset ... -o` writes them: [input, target] "
        "pairs (seq2seq) or input lengths (causal LM); the job's lengths are the longest sample's, as with a dataset",
        None,
        faces=frozenset({API}),
        api_type=InlineLengths | None,
        api={"max_length": MAX_INLINE_SAMPLES},
        api_help="your data's per-sample token lengths, inline (the server reads no dataset path): [input, target] "
        f"pairs (seq2seq) or input lengths (causal LM), at most {MAX_INLINE_SAMPLES:,} (a larger dataset: a seeded "
        "sample, `tuner lengths --dataset ... --max-samples N -o FILE`); the job's lengths are the longest sample's; "
        "stored with the study as the definition's `data` summary (exact up to 512 distinct pairs, else rounded up)",
    )
    job_flags: JobFlags | None = None
    #: settings the caller named even at their default value (the command line's, e.g. `--model builtin:tiny-t5`):
    #: a resumed study's stored ones must agree with them too
    given: frozenset[str] = frozenset()

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> SearchOptions:
        """The options from one flat mapping of settings (a face's keywords): JobFlags' go into ``job_flags``."""
        job = {f.name for f in dataclasses.fields(JobFlags)}
        return cls(
            **{k: v for k, v in values.items() if k not in job},
            job_flags=JobFlags(**{k: v for k, v in values.items() if k in job}),
        )


def cli_option(name: str) -> str:
    """How `tuner search` spells a setting in a message: ``global_batch`` -> ``--global-batch``."""
    return "--" + name.replace("_", "-")


def api_option(name: str) -> str:
    """How ``tuner.tune`` and an API body spell a setting in a message: its keyword argument."""
    return name


#: reads the user's baseline (``baseline``, ``training_args``: files or their contents) into the loader build_request
#: calls, keeping what it parsed in the list; None without a baseline
BaselineReader = Callable[[SearchOptions, Callable[[str], str], "list[Baseline]"], BaselineLoader | None]


def local_baseline(o: SearchOptions, option: Callable[[str], str], loaded: list[Baseline]) -> BaselineLoader | None:
    """The baseline of `tuner search` and ``tuner.tune``: the user's own files (or their contents as mappings)."""
    if o.training_args is not None and o.baseline is None:
        raise BaselineError(
            f"{option('training_args')} goes with {option('baseline')} (your DeepSpeed JSON or accelerate config); "
            f"pass both, or the training args alone as {option('baseline')}"
        )
    from tuner.interop.trainer_fill import checked_version

    version = checked_version(o.transformers_version, option)
    if o.baseline is None:
        return None
    return _baseline_loader(o.baseline, o.training_args, loaded, version)


@dataclass(frozen=True)
class Face:
    """How a front door reads what it is given and names a setting: the command line, tune(), the API body."""

    option: Callable[[str], str] = api_option  # a setting as this face spells it in a message
    model: Callable[[str], ModelSpec] = resolve_model
    baseline: BaselineReader = local_baseline
    length_hint: str | None = None  # how this face's user gives a length (None: build_request's, the CLI's words)


PYTHON = Face()
CLI = Face(option=cli_option)


def _space(space: FileOrMapping | None) -> tuple[Space, set[str]]:
    """The search space and the knobs it names (a file, an inline mapping, or the built-in one)."""
    if isinstance(space, Mapping):
        return inline_space(space), set(space)
    if space is None:
        return load_space(None), set()
    return load_space(space), space_file_knobs(space)


def engine_of_baseline(space: Space, listed: set[str], baseline: Mapping[str, Any] | None) -> Space:
    """The engine is the user's (their FSDP settings are part of the job): an FSDP2 baseline searches FSDP2 unless the
    space names its engines."""
    if baseline is None or "engine" in listed or baseline.get("engine") != "fsdp2":
        return space
    return space.restrict(engine=["fsdp2"])


def prepare_request(
    options: SearchOptions, storage: str, face: Face = PYTHON, cache_dir: Path | None = None
) -> tuple[SearchRequest, set[str]]:
    """Parses ``options`` (durations, sizes, files or mappings) and hands them to tuner.search.request.build_request,
    which checks them; returns the request on ``storage`` plus the settings given explicitly (what a resumed study
    must agree on). ``baseline`` is your DeepSpeed JSON or training-args JSON (a file, or its contents as a mapping);
    ``training_args`` the second one."""
    o, option = options, face.option
    budget_s = parse_duration(o.budget) if isinstance(o.budget, str) else float(o.budget)
    if budget_s <= 0:
        raise ConfigError(f"{option('budget')} must be positive, got {o.budget!r}")
    loaded: list[Baseline] = []
    baseline = face.baseline(o, option, loaded)
    parsed_space, listed = _space(o.space)
    parsed_space = engine_of_baseline(parsed_space, listed, loaded[-1].knobs if loaded else None)
    lengths = o.lengths
    lens = load_lengths(lengths) if isinstance(lengths, (str, Path)) else list(lengths) if lengths is not None else None
    request = build_search_request(
        study_name=check_study_name(o.study, option("study")) if o.study else _new_study_name(),
        storage=storage,
        model=face.model(o.model),
        space=parsed_space,
        budget_s=budget_s,
        world_size=o.world_size,
        global_batch=o.global_batch,
        device_memory=_size(o.device_memory, option),
        headroom=o.headroom,
        n_trials=o.n_trials,
        baseline=baseline,
        lengths=lens,
        schedule=Schedule(finalists=max(o.finalists, 0)),
        seed=o.seed,
        option=option,
        job_flags=o.job_flags,
        space_listed=listed,
        length_hint=face.length_hint,
        data=_data(o, option, cache_dir),
    )
    # the 64-rank and global-batch caps (the GPUs this host shows: check_world_size, before the study is written)
    check_job_limits(request.world_size, request.global_batch, option)
    if request.job is not None and request.job.lora is not None:  # its target modules are in the model, peft runs
        from tuner.job.lora import check_lora

        check_lora(request.model, request.job.lora, option)
    return request, explicit_settings(o, baseline_world=loaded[-1].world_size if loaded else None)


def _data(o: SearchOptions, option: Callable[[str], str], cache_dir: Path | None) -> DataJob | None:
    """The user's data: read from ``dataset`` on this host, or the lengths an API body carries inline."""
    if o.sample_lengths is not None:
        if o.lengths is not None:
            raise ConfigError(f"give {option('sample_lengths')} or {option('lengths')}, not both")
        return inline_data(o.sample_lengths, o.padding)
    return read_data(o, option, cache_dir) if o.dataset is not None else None


def read_data(o: SearchOptions, option: Callable[[str], str], cache_dir: Path | None) -> DataJob:
    """The lengths of ``o.dataset`` (its train split, and its eval split when given) with the model's tokenizer."""
    from tuner.job.data_job import DataJob
    from tuner.job.dataset import DataSource, read_lengths, tokenizer_for
    from tuner.job.padding import PADDINGS
    from tuner.settings import load_settings

    assert o.dataset is not None
    if o.padding not in PADDINGS:
        raise ConfigError(f"{option('padding')} {o.padding!r}: choose one of {', '.join(PADDINGS)}")
    if o.dataset is not None and o.lengths is not None:
        raise ConfigError(f"give {option('dataset')} or {option('lengths')}, not both (the dataset gives the lengths)")
    tokenizer = tokenizer_for(o.tokenizer, o.model, option)
    cache = cache_dir if cache_dir is not None else load_settings().cache_dir
    source = DataSource(o.dataset, o.split, o.input_column, o.target_column, o.text_column, o.max_samples)
    train = read_lengths(source, tokenizer, cache)
    evaluated = read_lengths(source.with_split(o.eval_split), tokenizer, cache) if o.eval_split else None
    return DataJob(
        train.lengths,
        train.describe(),
        o.padding,
        evaluated.lengths if evaluated is not None else None,
        evaluated.describe() if evaluated is not None else None,
        origin=train.origin(),
    )


def _size(value: str | int | None, option: Callable[[str], str]) -> int | None:
    if value is None:
        return None
    try:
        return parse_size(value)
    except TunerError as err:  # the same error, naming the setting
        raise type(err)(f"{option('device_memory')}: {err}") from None


def explicit_settings(o: SearchOptions, baseline_world: int | None) -> set[str]:
    """The definition fields the user set (a resumed study's stored ones must agree): given options, and what the
    baseline files decide (their world size, global batch and job)."""
    given = {
        "model": o.model != DEFAULT_MODEL or "model" in o.given,
        "space": o.space is not None,
        "world_size": o.world_size is not None or baseline_world is not None,
        "global_batch": o.global_batch is not None or o.baseline is not None,
        "device_memory": o.device_memory is not None,
        "objective": o.lengths is not None or o.dataset is not None or o.sample_lengths is not None,
        "data": o.dataset is not None or o.sample_lengths is not None,
        "job": o.baseline is not None or (o.job_flags is not None and o.job_flags != JobFlags()),
        "headroom": o.headroom != DEFAULT_HEADROOM or "headroom" in o.given,
        "baseline": o.baseline is not None,
    }
    return {key for key, set_ in given.items() if set_}


def _new_study_name() -> str:
    return "search-" + dt.datetime.now().strftime("%Y%m%d-%H%M%S")


def _mapping(given: Mapping[str, Any], what: str) -> dict[str, Any]:
    """A baseline given as a mapping, its nesting and size bounded as a file's (tuner.bounded)."""
    from tuner.bounded import check_shape

    check_shape(given, what)
    return dict(given)


def _baseline_loader(
    baseline: FileOrMapping,
    training_args: FileOrMapping | None,
    loaded: list[Baseline],
    transformers_version: str | None = None,
) -> Callable[[int | None, int], Baseline]:
    """Parses the user's files for a world size and the longest length (build_request calls it once it knows
    them), "auto" filled as ``transformers_version``'s Trainer fills it, keeping the parsed baseline in ``loaded``."""

    def load(world: int | None, max_length: int) -> Baseline:
        from tuner.interop.baseline import parse_baseline
        from tuner.interop.baseline_files import file_kind, load_baseline, read_json

        if not isinstance(baseline, Mapping) and not isinstance(training_args, Mapping):
            args_path = Path(training_args) if training_args is not None else None
            kw: dict[str, Any] = {"world_size": world, "max_length": max_length}
            loaded.append(load_baseline(Path(baseline), args_path, **kw, transformers_version=transformers_version))
            return loaded[-1]
        first = (
            _mapping(baseline, "baseline")
            if isinstance(baseline, Mapping)
            else read_json(Path(baseline), "baseline file")
        )
        second = None
        if training_args is not None:
            second = (
                _mapping(training_args, "training_args")
                if isinstance(training_args, Mapping)
                else read_json(Path(training_args), "training-args file")
            )
        kind = file_kind(first)
        ds, hf = (first, second) if kind == "deepspeed" else (None, second) if kind == "accelerate" else (None, first)
        if second is not None and kind == "hf":
            raise BaselineError("two training-args given; pass one DeepSpeed JSON and one training-args JSON")
        accelerate = first if kind == "accelerate" else None
        version = transformers_version
        kw = {"world_size": world, "max_length": max_length, "transformers_version": version}
        loaded.append(parse_baseline(ds, hf, **kw, accelerate=accelerate))
        return loaded[-1]

    return load
