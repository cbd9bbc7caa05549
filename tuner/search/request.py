"""A search request and the study definition it writes: what a study searches, resumed as stored.

``SearchRequest.definition()`` is what `tuner search` stores on a new study (and what ``POST /studies`` writes);
re-running a study rebuilds the request from it, so every worker of a study searches the same space.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trials.contract import BUILTIN_PREFIX, Knobs, ModelSpec
from tuner.errors import BaselineError, ConfigError, TunerError
from tuner.job.batching import default_global_batch, held_global_batch, require_reachable
from tuner.job.definition import BUILTIN_DEFAULTS, Job, JobFlags, fix_space, hold_engine, resolve_job
from tuner.job.ledger.trl import check_model, recipe_args
from tuner.job.nodes import node_space
from tuner.job.objective import Objective, objective_for
from tuner.job.provenance import Held, sources_line
from tuner.job.space import Space, space_from_definition
from tuner.records import DEFAULT_HEADROOM, RecordError, StudyDefinition
from tuner.search.schedule import Schedule

if TYPE_CHECKING:
    from tuner.interop.baseline import Baseline
    from tuner.job.data_job import DataJob


@dataclass
class SearchRequest:
    study_name: str
    storage: str
    model: ModelSpec
    space: Space
    world_size: int
    global_batch: int
    objective: Objective
    budget_s: float
    device_memory: int | None = None
    headroom: float = DEFAULT_HEADROOM
    n_trials: int | None = None
    baseline: Knobs | None = None
    # the user's DeepSpeed JSON, "auto" resolved as their Trainer fills it, with the fixes it needs written (what the
    # search's probes run and the exports give: tuner.interop.baseline.Baseline.probe_source)
    baseline_source: dict[str, Any] | None = None
    baseline_files: dict[str, Any] | None = None  # the user's files as given: {"deepspeed": ..., "training_args": ...}
    # the Trainer the baseline was filled for and its fixes (tuner.interop.trainer_fill): trial 0 runs without them
    trainer: dict[str, Any] | None = None
    # the user's FSDP2 settings every fsdp2 probe holds (trials.contract.FsdpSettings as JSON; from an FSDP2 baseline)
    fsdp: dict[str, Any] | None = None
    schedule: Schedule = field(default_factory=Schedule)
    seed: int | None = None
    job: Job | None = None  # what stays fixed (tuner.job.definition); None: a study stored before the job existed
    job_changes: tuple[str, ...] = ()  # job knobs a space file searches on purpose
    data: DataJob | None = None  # the user's data (--dataset): its lengths; stored as their summary (definition)
    length_sources: dict[str, str] = field(default_factory=dict)  # where each job length came from
    sources: str | None = None  # where each held value came from, in a line (tuner.job.provenance; not stored)
    nnodes: int = 1  # the nodes every probe spans (world_size / nnodes ranks on each; tuner.session.nodes)
    files_global_batch: int | None = None  # their files' global batch, where the search's is a change asked for

    def data_lines(self) -> list[str]:
        """What the dry run and a search's header say about the data (none without --dataset)."""
        if self.data is None or self.job is None:
            return []
        return self.data.lines(self.job.max_length, self.job.max_target_length, self.length_sources)

    def definition(self) -> dict[str, Any]:
        """The stored definition; with data, its lengths' summary (tuner.job.length_summary) under ``data``."""
        data = {"data": self.data.summary().to_json()} if self.data is not None else {}
        return {
            "model": self.model.model_dump(mode="json"),
            "job": self.job.model_dump(mode="json") if self.job is not None else None,
            "job_changes": list(self.job_changes),
            "space": self.space.model_dump(mode="json"),
            "world_size": self.world_size,
            "global_batch": self.global_batch,
            "device_memory": self.device_memory,
            "headroom": self.headroom,
            "objective": self.objective.to_dict(),
            "budget_s": self.budget_s,
            "baseline": self.baseline.model_dump(mode="json") if self.baseline is not None else None,
            "baseline_source": self.baseline_source,
            "baseline_files": self.baseline_files,
            "finalists": self.schedule.finalists,
            **({"trainer": self.trainer} if self.trainer is not None else {}),
            **({"fsdp": self.fsdp} if self.fsdp is not None else {}),
            **({"nnodes": self.nnodes} if self.nnodes > 1 else {}),
            **({"files_global_batch": self.files_global_batch} if self.files_global_batch is not None else {}),
            **data,
        }


#: parses the user's baseline for a world size (None: the baseline's own) and the space's longest max_length
BaselineLoader = Callable[[int | None, int], "Baseline"]


def build_request(
    *,
    study_name: str,
    storage: str,
    model: ModelSpec,
    space: Space,
    budget_s: float,
    world_size: int | None = None,
    global_batch: int | None = None,
    device_memory: int | None = None,
    headroom: float = DEFAULT_HEADROOM,
    n_trials: int | None = None,
    baseline: BaselineLoader | None = None,
    lengths: Sequence[int] | None = None,
    schedule: Schedule | None = None,
    seed: int | None = None,
    option: Callable[[str], str] = str,
    job_flags: JobFlags | None = None,
    space_listed: Collection[str] = (),
    length_hint: str | None = None,
    data: DataJob | None = None,
    nnodes: int = 1,
    change_global_batch: bool = False,
) -> SearchRequest:
    """The one place `tuner search` (tuner.cli.search) and ``POST /studies`` (api.definitions) check a search's
    settings and build its request from values each has already parsed from its own input (files, a JSON body).

    Checks the numbers, then parses the baseline (``baseline(world_size, longest max_length)``, so a file or an
    inline body is the caller's business), then derives what is left unset: the world size from the option, else
    the baseline's, else 1; the global batch from the option, else the baseline's, else the smallest one every micro
    batch choice reaches. The space keeps only the micro batches that reach that global batch exactly, and the
    baseline's own micro batch must reach it too. ``option(field)`` is how the caller spells a setting in a message
    (``--global-batch`` on the command line, ``global_batch`` in a JSON body). Raises ConfigError / BaselineError."""
    if not 0 < headroom <= 1:
        raise ConfigError(
            f"{option('headroom')} {headroom} must be in (0, 1], e.g. 0.9 keeps 10% of device memory free"
        )
    for name, value in (("world_size", world_size), ("n_trials", n_trials), ("global_batch", global_batch)):
        if value is not None and value < 1:
            raise ConfigError(f"{option(name)} {value} must be at least 1")
    flags = job_flags or JobFlags()
    if flags.max_length is None and "max_length" in space_listed:  # a space file naming lengths says what they are
        flags = dataclasses.replace(flags, max_length=max(space.max_length))
    builtin = model.source.startswith(BUILTIN_PREFIX)
    data_longest = data.defaults().max_length if data is not None else None
    guess = (
        flags.max_length or data_longest or (int(BUILTIN_DEFAULTS["max_length"]) if builtin else max(space.max_length))
    )
    base = baseline(world_size, guess) if baseline is not None else None
    check_model(base.hf_args if base is not None else None, model.source, option("model"))
    args = recipe_args(base.hf_args) if base is not None else None  # an SFT recipe: TRL's default max_length
    sources: dict[str, str] = {}
    if data is not None:  # their data's longest sample, unless their args or a flag set a length (then: truncation)
        from tuner.job.data_job import fill_from_data, length_sources

        sources = length_sources(flags, args, True, builtin)
        flags = fill_from_data(flags, data, args)
    job = resolve_job(
        builtin=builtin,
        baseline_knobs=base.knobs if base is not None else None,
        hf_args=args,
        flags=flags,
        **({"length_hint": length_hint} if length_hint else {}),
        trainer=(base.trainer_args, base.seq2seq_args) if base is not None else None,
        compile=base.compile if base is not None else None,
        option=option,
    )
    if data is not None:  # an SFT recipe's packing: the rows SFTTrainer trains on (tuner.job.packing)
        from tuner.job.packed_data import packed_data

        data = packed_data(data, args, job.max_length)
        lengths = lengths if lengths is not None else data.lengths.input.tolist()
    space = hold_engine(space, str(base.knobs["engine"]) if base is not None else None, space_listed)
    space, job_changes = fix_space(space, job, space_listed)
    base_knobs = None
    if base is not None:  # trial 0 runs the user's config on their job
        fixed = {"precision": job.precision, "max_length": job.max_length}
        evaluation = {"eval_batch_size": job.eval_batch_size, "generate": job.generate}
        base_knobs = Knobs.model_validate({**base.knobs, **fixed, **evaluation})
    world = world_size or (base.world_size if base is not None else None) or 1
    space = node_space(space, world, nnodes, space_listed)
    files_batch = _files_batch(base, world)
    files_how = _files_how(base, world)
    batch = held_global_batch(global_batch, files_batch, files_how, change_global_batch, option)
    changed = files_batch if batch is not None and files_batch is not None and batch != files_batch else None
    batch_source = _batch_source(global_batch, base, world)
    if changed is not None:
        batch_source = f"{batch}: {option('change_global_batch')}, a change to your files' {changed} ({files_how})"
    batch = batch or default_global_batch(space.micro_batch_size, world)
    space = space.restrict(micro_batch_size=require_reachable(space.micro_batch_size, batch, world))
    if base_knobs is not None and batch % (base_knobs.micro_batch_size * world):
        raise BaselineError(
            f"baseline micro batch {base_knobs.micro_batch_size} x world size {world} cannot reach global batch "
            f"{batch}; set {option('global_batch')} to a multiple of it"
        )
    return SearchRequest(
        study_name=study_name,
        storage=storage,
        model=model,
        space=space,
        world_size=world,
        global_batch=batch,
        objective=objective_for(space.max_length, lengths, drawn=data is not None),
        budget_s=budget_s,
        device_memory=device_memory,
        headroom=headroom,
        n_trials=n_trials,
        baseline=base_knobs,
        baseline_source=base.probe_source() if base is not None else None,
        baseline_files=base.files() if base is not None else None,
        trainer=base.trainer() if base is not None else None,
        fsdp=base.fsdp if base is not None else None,
        schedule=schedule if schedule is not None else Schedule(),
        seed=seed,
        job=job,
        job_changes=tuple(job_changes),
        data=data,
        length_sources=sources,
        sources=sources_line(
            job,
            Held(
                flags,
                base.hf_args if base is not None else None,
                base.ds_config if base is not None and base.ds_config else None,
                builtin,
                sources,
                batch_source,
                option("world_size") if world_size else ("your files" if base and base.world_size else "1: default"),
            ),
        ),
        nnodes=nnodes,
        files_global_batch=changed,
    )


def _files_batch(base: Baseline | None, world: int) -> int | None:
    """The global batch their files give: micro x accumulation x world size (the option's, the files', else 1)."""
    if base is None:
        return None
    return base.global_batch or int(base.knobs["micro_batch_size"]) * base.gradient_accumulation_steps * world


def _files_how(base: Baseline | None, world: int) -> str:
    """How their files make their global batch, in words (empty without files)."""
    if base is None:
        return ""
    return f"micro {base.knobs['micro_batch_size']} x accumulation {base.gradient_accumulation_steps} x world {world}"


def _batch_source(given: int | None, base: Baseline | None, world: int) -> str:
    """Where the global batch comes from, in words."""
    if given:
        return f"{given}: option"
    if base is not None:
        return f"{_files_batch(base, world)}: your files, {_files_how(base, world)}"
    return "the smallest every micro batch of the space reaches: no file or option gives one"


#: definition keys a resumed study must agree on: they decide which configs exist and what they measure
ESSENTIAL = ("model", "job", "space", "world_size", "nnodes", "global_batch", "device_memory", "objective")
#: an option that sets several stored fields: each must agree
FIELDS_OF = {"baseline": ("baseline", "baseline_source", "baseline_files", "fsdp")}


def check_resume(name: str, stored: dict[str, Any], wanted: dict[str, Any], explicit: set[str]) -> None:
    """A re-run of an existing study keeps its definition; an option the user set (``explicit``: any definition
    field, e.g. headroom or baseline, not only the ESSENTIAL ones) that contradicts the stored field is an error
    naming the field. Also for a worker that lost the race to create the study: it compares with the winner's."""
    for option in sorted(explicit):
        for key in FIELDS_OF.get(option, (option,)):
            if key == "data" and stored.get(key) is None:  # a study from before the data was stored: nothing to hold
                continue
            if key in wanted and stored.get(key) != wanted.get(key):
                shown = _data_source(stored[key]) if key == "data" else _short(stored.get(key))
                raise ConfigError(
                    f"study {name!r} was created with a different {key} ({shown}); drop the "
                    f"option to resume it, or pick a new --study name"
                )


def _data_source(stored: Any) -> str:
    """A stored data summary as a resume error names it: where its lengths came from, and how many."""
    try:
        from tuner.job.length_summary import LengthSummary

        summary = LengthSummary.from_json(stored)
        return _short(summary.origin.describe(summary.samples))
    except (TunerError, TypeError, ValueError):
        return _short(stored)


def _short(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def request_from_definition(base: SearchRequest, stored: StudyDefinition | dict[str, Any]) -> SearchRequest:
    """The request to resume a study with: its stored definition, this run's budget, trials and seed. RecordError
    (one line) for a definition that lacks what a search needs (the model, the space, the world size, the global
    batch)."""
    d = StudyDefinition.of(stored)
    if d.model is None or d.space is None or d.world_size is None or d.global_batch is None:
        raise RecordError(
            f"study {base.study_name!r}: its stored definition lacks the model, space, world size or global batch; "
            "pick a new --study name"
        )
    return SearchRequest(
        study_name=base.study_name,
        storage=base.storage,
        model=ModelSpec.model_validate(d.model),
        space=space_from_definition(d.space),
        world_size=d.world_size,
        global_batch=d.global_batch,
        objective=Objective.from_dict(d.objective),
        budget_s=base.budget_s,
        device_memory=d.device_memory,
        headroom=d.headroom,
        n_trials=base.n_trials,
        baseline=Knobs.model_validate(d.baseline) if d.baseline else None,
        baseline_source=d.baseline_source,
        baseline_files=d.baseline_files,
        trainer=d.trainer,
        fsdp=d.fsdp,
        schedule=base.schedule,
        seed=base.seed,
        job=Job.model_validate(d.job) if d.job else None,
        job_changes=d.job_changes,
        data=base.data if base.data is not None else stored_data(d),
        length_sources=base.length_sources if base.data is not None else _STORED_SOURCES,
        nnodes=d.nnodes or 1,
        files_global_batch=d.files_global_batch,
    )


_STORED_SOURCES = {"max_length": "the study's job", "max_target_length": "the study's job"}


def stored_data(definition: StudyDefinition) -> DataJob | None:
    """The data a resumed search probes on when this run reads none: the study's stored summary expanded
    (tuner.job.length_summary; rounded up, so the worst batch is conservative). The data a run reads (``--dataset``)
    wins: it is compared with the stored summary (check_resume) and its lengths are exact. None: no summary stored;
    RecordError (one line) for a stored one tuner cannot read."""
    if definition.data is None:
        return None
    from tuner.job.data_job import stored_data_job
    from tuner.job.length_summary import LengthSummary, SummaryError

    try:
        return stored_data_job(LengthSummary.from_json(definition.data))
    except SummaryError as err:
        raise RecordError(f"{err}; give --dataset to probe on your data, or pick a new --study name") from err
