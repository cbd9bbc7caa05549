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
from tuner.declared import (
    API,
    DATA_PANEL,
    ESTIMATE,
    EVERY_SEARCH_FACE,
    EXPLAIN,
    SEARCH,
    SEARCH_PANEL,
    STORAGE_PANEL,
    TUNE,
    setting,
)
from tuner.errors import ConfigError, TunerError
from tuner.job.definition import JobFlags
from tuner.job.inline_data import MAX_INLINE_SAMPLES, InlineLengths, inline_data
from tuner.job.model_source import resolve_local_model
from tuner.job.nodes import MAX_NODES, check_storage, node_layout
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
from tuner.session.their_files import DEFAULT_MODEL, FileOrMapping, local_baseline, recipe_model
from tuner.units import parse_duration, parse_memory

if TYPE_CHECKING:
    from tuner.interop.baseline import Baseline
    from tuner.job.data_job import DataJob

_LOCAL = frozenset({SEARCH, TUNE})  # settings of one run on this host (files, a budget, a seed), not of a study
_ESTIMATED = EVERY_SEARCH_FACE | {ESTIMATE, EXPLAIN}  # the job: `tuner estimate` and `tuner explain` have them too
_DATA = _LOCAL | {ESTIMATE, EXPLAIN}  # the user's data: read on this host (POST /studies takes no server path)


@dataclass(frozen=True)
class SearchOptions:
    """A search as the user gives it: ``budget`` a duration ("30m") or seconds; ``space``, ``baseline`` and
    ``training_args`` files or their contents; ``lengths`` a file or token lengths; ``job_flags`` the job settings
    given on their own (--max-length, --precision, --lora-r ...). None: not given (the built-in default, or the
    files'). Each field's declaration (tuner.declared.setting) is what every face shows of it."""

    budget: str | float = setting(
        "wall-clock budget for the whole search: 90s, 30m, 2h, 1h30m", cli_type=str, faces=_LOCAL, panel=SEARCH_PANEL
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
        panel=SEARCH_PANEL,
        api_type=dict[str, Any] | None,
        api_help="inline search space over the default (knob -> choices)",
    )
    storage: str | None = setting(
        "SQLAlchemy URL (default: $TUNER_STORAGE or sqlite:///tuner.db)",
        None,
        faces=_LOCAL | {ESTIMATE, EXPLAIN},
        panel=STORAGE_PANEL,
    )
    study: str | None = setting(
        "study name; an existing one is resumed", None, faces=_LOCAL | {EXPLAIN}, panel=STORAGE_PANEL
    )
    world_size: int | None = setting(
        "ranks per probe (data-parallel GPUs)", None, faces=_ESTIMATED, api={"ge": 1, "le": MAX_WORLD_SIZE}
    )
    nnodes: int | None = setting(
        "nodes each probe spans: run this same command on every node (or srun -N N --ntasks-per-node 1 tuner search "
        "...); the workers meet in the study's PostgreSQL (default: the Slurm step's nodes, else 1)",
        None,
        min=1,
        faces=_ESTIMATED,
        api={"ge": 1, "le": MAX_NODES},
    )
    nproc_per_node: int | None = setting(
        "ranks (GPUs) per node of a search across nodes: world size = nnodes x nproc-per-node",
        None,
        min=1,
        faces=_ESTIMATED,
        api={"ge": 1, "le": MAX_WORLD_SIZE},
    )
    device_memory: str | int | None = setting(
        "memory per rank, e.g. 80GiB (default: the device's)", None, cli_type=str, faces=_ESTIMATED
    )
    headroom: float = setting(
        "stable = peak <= headroom x device memory", DEFAULT_HEADROOM, api={"gt": 0, "le": 1}, panel=SEARCH_PANEL
    )
    global_batch: int | None = setting(
        "samples per optimizer step, held fixed", None, faces=_ESTIMATED, api={"ge": 1, "le": MAX_GLOBAL_BATCH}
    )
    change_global_batch: bool = setting(
        "search --global-batch as a change to your files' global batch (micro x accumulation x world); without it a "
        "different one is refused",
        False,
        faces=_ESTIMATED,
    )
    n_trials: int | None = setting("stop exploring after this many probes", None, faces=_LOCAL, panel=SEARCH_PANEL)
    baseline: FileOrMapping | None = setting(
        "your current DeepSpeed JSON, HF training-args JSON or accelerate config (FSDP); probed first",
        None,
        faces=_ESTIMATED,
        cli_type=Path,
        api_type=dict[str, Any] | None,
        api_help="your current DeepSpeed config (HF 'auto' values allowed), probed first as trial 0",
    )
    lengths: Path | str | Sequence[int] | None = setting(
        "file of your samples' token lengths (retained-token objective)",
        None,
        cli_type=Path,
        faces=_LOCAL,
        panel=DATA_PANEL,
    )
    finalists: int = setting(
        "best stable configs re-probed longer before the pick", 2, faces=_LOCAL, panel=SEARCH_PANEL
    )
    seed: int | None = setting("sampler seed", None, faces=_LOCAL, panel=SEARCH_PANEL)
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
        "filled as its Trainer fills them, its TrainingArguments' fields read, and the exports written for it",
        None,
        faces=_ESTIMATED,
        api_help="the transformers release your training runs on (default: the worker's): the baseline's 'auto' "
        "values are filled as its Trainer fills them, e.g. 5.17.0",
    )
    estimate: bool | None = setting(
        "skip configs a memory trace predicts far over budget (default: on for budgets of 10 minutes or more)",
        None,
        flag="--estimate/--no-estimate",
        faces=_LOCAL,
        panel=SEARCH_PANEL,
    )
    # the user's data (tuner.job.dataset): the job's lengths and batches come from it
    dataset: str | None = setting(
        "your training data: a save_to_disk folder, a JSON-lines/JSON/CSV/Parquet file or folder, or a hub dataset "
        "in your local cache; the job's lengths are its samples'",
        None,
        faces=_DATA,
        panel=DATA_PANEL,
    )
    split: str = setting("the dataset's training split", "train", faces=_DATA, panel=DATA_PANEL)
    eval_split: str | None = setting(
        "the dataset's eval split (its lengths are shown)", None, faces=_DATA, panel=DATA_PANEL
    )
    input_column: str | None = setting("seq2seq input text column of --dataset", None, faces=_DATA, panel=DATA_PANEL)
    target_column: str | None = setting("seq2seq label text column of --dataset", None, faces=_DATA, panel=DATA_PANEL)
    text_column: str | None = setting("causal LM text column of --dataset", None, faces=_DATA, panel=DATA_PANEL)
    tokenizer: str | None = setting(
        "tokenizer id or directory for --dataset (default: the model's own; built-in presets have none)",
        None,
        faces=_DATA,
        panel=DATA_PANEL,
    )
    padding: Padding = setting(
        "how your collator pads: longest (per batch, the Trainer's default) or max_length",
        "longest",
        cli_type=str,
        faces=_DATA,
        panel=DATA_PANEL,
    )
    max_samples: int | None = setting(
        "scan a seeded random sample of this many samples of --dataset", None, min=1, faces=_DATA, panel=DATA_PANEL
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


@dataclass(frozen=True)
class Face:
    """How a front door reads what it is given and names a setting: the command line, tune(), the API body."""

    option: Callable[[str], str] = api_option  # a setting as this face spells it in a message
    model: Callable[[str], ModelSpec] = resolve_local_model  # the API's: ids and presets, no hub request
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


def prepare_request(
    options: SearchOptions, storage: str, face: Face = PYTHON, cache_dir: Path | None = None
) -> tuple[SearchRequest, set[str]]:
    """Parses ``options`` (durations, sizes, files or mappings) and hands them to tuner.search.request.build_request,
    which checks them; returns the request on ``storage`` plus the settings given explicitly (what a resumed study
    must agree on). ``baseline`` is your DeepSpeed JSON or training-args JSON (a file, or its contents as a mapping);
    ``training_args`` the second one."""
    o, option = options, face.option
    from tuner.settings import slurm_step

    nnodes, world_size = node_layout(o.nnodes, o.nproc_per_node, o.world_size, slurm_step(), option)
    check_storage(storage, nnodes, option)
    budget_s = parse_duration(o.budget) if isinstance(o.budget, str) else float(o.budget)
    if budget_s <= 0:
        raise ConfigError(f"{option('budget')} must be positive, got {o.budget!r}")
    loaded: list[Baseline] = []
    baseline = face.baseline(o, option, loaded)
    parsed_space, listed = _space(o.space)
    lengths = o.lengths
    lens = load_lengths(lengths) if isinstance(lengths, (str, Path)) else list(lengths) if lengths is not None else None
    request = build_search_request(
        study_name=check_study_name(o.study, option("study")) if o.study else _new_study_name(),
        storage=storage,
        model=face.model(recipe_model(o) or o.model),  # a TRL recipe's model_name_or_path where none was named
        space=parsed_space,
        budget_s=budget_s,
        world_size=world_size,
        global_batch=o.global_batch,
        device_memory=device_memory_size(o.device_memory, option),
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
        nnodes=nnodes,
        change_global_batch=o.change_global_batch,
    )
    if loaded:  # their accelerate config's machines are the search's nodes; its HSDP replicas are trial 0's
        from tuner.interop.baseline_nodes import check_machines, with_replicas

        accelerate = loaded[-1].files().get("accelerate")
        check_machines(accelerate, nnodes, option)
        request = dataclasses.replace(request, baseline=with_replicas(request.baseline, accelerate, request.world_size))
    # the 64-rank (per node) and global-batch caps (the GPUs this host shows: check_world_size, before the study is
    # written)
    check_job_limits(request.world_size // nnodes, request.global_batch, option)
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


def device_memory_size(value: str | int | None, option: Callable[[str], str]) -> int | None:
    """The bytes of ``value`` (a size with its unit), an error naming the setting as ``option`` spells it."""
    if value is None:
        return None
    try:
        return parse_memory(value)
    except TunerError as err:  # the same error, naming the setting
        raise type(err)(f"{option('device_memory')}: {err}") from None


def explicit_settings(o: SearchOptions, baseline_world: int | None) -> set[str]:
    """The definition fields the user set (a resumed study's stored ones must agree): given options, and what the
    baseline files decide (their world size, global batch and job)."""
    given = {
        "model": o.model != DEFAULT_MODEL or "model" in o.given,
        "space": o.space is not None,
        "world_size": o.world_size is not None or o.nproc_per_node is not None or baseline_world is not None,
        "nnodes": o.nnodes is not None or o.nproc_per_node is not None,
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
