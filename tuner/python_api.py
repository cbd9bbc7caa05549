"""The Python API: ``tuner.tune(...)``, ``tuner.best_config(...)``, ``tuner.estimate(...)``.

`tuner search`, `tuner best` and `tuner estimate` are thin layers over these: the CLI parses its options into the
same arguments (tuner.cli.search calls ``prepare_request`` / ``resolve`` / ``real_probe`` from here). Every mistake is
a typed exception from tuner.errors with the one line the CLI prints. ``tune`` is named so because ``tuner.search`` is
the search package.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trials.contract import Knobs, ProbeConfig, ProbeResult
from tuner.errors import BaselineError, ConfigError, NoStableConfig, StudyNotFound
from tuner.job.definition import JobFlags
from tuner.job.model_source import resolve_model
from tuner.job.objective import load_lengths
from tuner.job.space import Space, check_job_limits, inline_space, load_space, space_file_knobs
from tuner.search.request import SearchRequest, check_resume, request_from_definition
from tuner.search.request import build_request as build_search_request
from tuner.search.rows import DEFAULT_HEADROOM, Fidelity, ProbeRow
from tuner.search.schedule import Schedule
from tuner.settings import load_settings, redact_url
from tuner.storage import Store
from tuner.units import parse_duration, parse_size

if TYPE_CHECKING:
    from tuner.interop.baseline import Baseline
    from tuner.memory.estimator import Estimate
    from tuner.search.driver import Listener, Search, SearchSummary
    from tuner.search.selection import Candidate

DEFAULT_MODEL = "builtin:tiny-t5"
Probe = Callable[[ProbeConfig], ProbeResult]


def cli_option(name: str) -> str:
    """How `tuner search` spells a setting in a message: ``global_batch`` -> ``--global-batch``."""
    return "--" + name.replace("_", "-")


def api_option(name: str) -> str:
    """How ``tuner.tune`` spells a setting in a message: its keyword argument."""
    return name


def _space(space: Path | str | Mapping[str, Any] | None) -> tuple[Space, set[str]]:
    """The search space and the knobs it names (a file, an inline mapping, or the built-in one)."""
    if isinstance(space, Mapping):
        return inline_space(space), set(space)
    if space is None:
        return load_space(None), set()
    return load_space(space), space_file_knobs(space)


def prepare_request(
    *,
    budget: str | float,
    model: str = DEFAULT_MODEL,
    space: Path | str | Mapping[str, Any] | None = None,
    storage: str | None = None,
    study: str | None = None,
    world_size: int | None = None,
    device_memory: str | int | None = None,
    headroom: float = DEFAULT_HEADROOM,
    global_batch: int | None = None,
    n_trials: int | None = None,
    baseline: Path | str | Mapping[str, Any] | None = None,
    training_args: Path | str | Mapping[str, Any] | None = None,
    lengths: Path | str | Sequence[int] | None = None,
    finalists: int = 2,
    seed: int | None = None,
    job_flags: JobFlags | None = None,
    option: Callable[[str], str] = api_option,
) -> tuple[SearchRequest, set[str]]:
    """Parses the settings (durations, sizes, files or mappings) and hands them to
    tuner.search.request.build_request, which checks them; returns the request plus the settings given explicitly
    (what a resumed study must agree on). ``baseline`` is your DeepSpeed JSON or training-args JSON (a file, or its
    contents as a mapping); ``training_args`` the second one."""
    budget_s = parse_duration(budget) if isinstance(budget, str) else float(budget)
    if budget_s <= 0:
        raise ConfigError(f"{option('budget')} must be positive, got {budget!r}")
    spec = resolve_model(model)
    parsed_space, listed = _space(space)
    memory = parse_size(device_memory) if device_memory is not None else None
    lens = load_lengths(lengths) if isinstance(lengths, (str, Path)) else list(lengths) if lengths is not None else None
    loaded: list[Baseline] = []
    if training_args is not None and baseline is None:
        raise BaselineError(
            f"{option('training_args')} goes with {option('baseline')} (your DeepSpeed JSON); pass both, or the "
            f"training args alone as {option('baseline')}"
        )

    def load(world: int | None, max_length: int) -> Baseline:
        from tuner.interop.baseline import file_kind, load_baseline, parse_baseline, read_json

        assert baseline is not None
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

    request = build_search_request(
        study_name=study or "search-" + dt.datetime.now().strftime("%Y%m%d-%H%M%S"),
        storage=load_settings(storage=storage).storage,
        model=spec,
        space=parsed_space,
        budget_s=budget_s,
        world_size=world_size,
        global_batch=global_batch,
        device_memory=memory,
        headroom=headroom,
        n_trials=n_trials,
        baseline=load if baseline is not None else None,
        lengths=lens,
        schedule=Schedule(finalists=max(finalists, 0)),
        seed=seed,
        option=option,
        job_flags=job_flags,
        space_listed=listed,
    )
    # the 64-rank and global-batch caps (the GPUs this host shows: check_world_size, before the study is written)
    check_job_limits(request.world_size, request.global_batch, option)
    base_world = loaded[-1].world_size if loaded else None
    explicit = {
        key
        for key, given in {
            "model": model != DEFAULT_MODEL,
            "space": space is not None,
            "world_size": world_size is not None or base_world is not None,
            "global_batch": global_batch is not None or baseline is not None,
            "device_memory": device_memory is not None,
            "objective": lengths is not None,
            "job": baseline is not None or (job_flags is not None and job_flags != JobFlags()),
            "headroom": headroom != DEFAULT_HEADROOM,
            "baseline": baseline is not None,
        }.items()
        if given
    }
    return request, explicit


def resolve(request: SearchRequest, explicit: set[str], store: Store) -> tuple[SearchRequest, bool]:
    """Creates the study definition, or resumes an existing one with its stored definition."""
    wanted = request.definition()
    stored, created = store.create_study(request.study_name, wanted)
    if created:
        return request, False
    check_resume(request.study_name, stored, wanted, explicit)
    return request_from_definition(request, stored), True


def check_world_size(request: SearchRequest) -> None:
    """World size above the GPUs this process may use (CUDA_VISIBLE_DEVICES, MIG): a ConfigError before anything
    is written or probed."""
    from tuner.probing import gpus

    visible, physical, cuda_visible = gpus.host_visible_devices()
    gpus.check_world_size(request.world_size, visible, physical, cuda_visible)


def check_host(request: SearchRequest, store: Store, resumed: bool) -> None:
    """Before the first probe on a GPU host: a resumed study's GPU type must be this host's (unless its device
    memory is fixed: a frontier learned on one device's limits must not rule another's), and a multi-rank search
    passes the NCCL preflight (all ranks, one all_reduce and a barrier, 90 s). ConfigError with one line if not."""
    import tempfile

    from tuner.probing import gpus
    from tuner.search.host_record import check_host_record

    check_host_record(store, request.study_name, request.device_memory is not None, resumed)  # GPU and versions
    visible, physical, _ = gpus.host_visible_devices()
    if not (physical and visible):
        return
    if resumed:
        first = next((row for row in store.probes(request.study_name, limit=5) if row.result), None)
        stored = (first.result or {}).get("fingerprint") if first is not None else None
        here = gpus.gpu_name(gpus.first_visible_index(visible))
        refusal = gpus.fingerprint_refusal(stored, here, request.device_memory is not None)
        if refusal:
            raise ConfigError(refusal)
    if request.world_size > 1:
        from tuner.probing.preflight import run_preflight
        from tuner.probing.runner import probe_env

        with tempfile.TemporaryDirectory() as d:
            problem = run_preflight(request.world_size, probe_env(request.world_size), Path(d))
        if problem:
            raise ConfigError(problem)


def attach_estimate(runner: Search, request: SearchRequest, estimate: bool | None) -> str | None:
    """Traces the model for the memory estimate when asked (``estimate``; None: for budgets of 10 minutes or more)
    and gives it to the search; returns the note to show (how long it took, or why it is unavailable)."""
    from tuner.memory.tracing import ESTIMATE_AUTO_MIN_BUDGET_S, build_estimator

    if not (estimate if estimate is not None else request.budget_s >= ESTIMATE_AUTO_MIN_BUDGET_S):
        return None
    estimator, note = build_estimator(request, timeout_s=min(600.0, 0.2 * request.budget_s))
    runner.attach_estimator(estimator)
    return note


@dataclass(frozen=True)
class Plan:
    """What a search would do, before any device is used (`tuner search --dry-run`)."""

    job: str | None  # the job held fixed (Job.describe)
    configs: int  # configs in the space that reach the global batch
    ruled_out: int | None  # of those, what the memory estimate puts far over the device memory (None: no estimate)
    estimate_note: str | None  # how the trace went, or why there is none
    expected_probes: int  # about: the configs left, at most --n-trials, at most what the budget holds
    expected_s: float  # about: expected_probes x the first probe's expected seconds, at most the budget

    def lines(self, request: SearchRequest) -> list[str]:
        ruled = "no memory estimate" if self.ruled_out is None else f"{self.ruled_out} ruled out by the memory estimate"
        out = [
            f"study {request.study_name}: {request.model.source}, world size {request.world_size}, global batch "
            f"{request.global_batch}, budget {request.budget_s:.0f} s",
            f"your job (held fixed): {self.job}" if self.job else "your job: (no job settings stored)",
            f"space: {self.configs} configs; {ruled}",
        ]
        if self.estimate_note:
            out.append(self.estimate_note)
        out.append(
            f"expected: at most about {self.expected_probes} probes in {self.expected_s / 60:.0f} min (before any "
            f"probe is measured, one is guessed at {request.schedule.first_probe_s:.0f} s; inferred configs cost "
            "nothing)"
        )
        out.append("nothing was written and no device was used; run without --dry-run to search")
        return out


def plan(request: SearchRequest, estimate: bool | None) -> Plan:
    """The dry run of ``request``: the space, what the memory estimate rules out (a trace, on CPU), the expected
    probe count and time. Writes nothing, probes nothing."""
    from tuner.memory.tracing import ESTIMATE_AUTO_MIN_BUDGET_S, build_estimator

    configs = list(request.space.configs())
    ruled_out, note = None, None
    use = estimate if estimate is not None else request.budget_s >= ESTIMATE_AUTO_MIN_BUDGET_S
    if use:
        estimator, note = build_estimator(request, timeout_s=min(600.0, 0.2 * request.budget_s))
        capacity = request.device_memory
        if estimator is not None and capacity:
            margin = request.schedule.estimate_margin
            ruled_out = sum(1 for k in configs if _predicted(estimator, k) > margin * capacity)
        elif estimator is not None:
            note = f"{note}; without --device-memory the estimate rules nothing out before the first probe"
    left = len(configs) - (ruled_out or 0)
    per_probe = request.schedule.first_probe_s
    probes = min(left, request.n_trials or left, max(1, int(request.budget_s // per_probe)))
    return Plan(
        job=request.job.describe() if request.job is not None else None,
        configs=len(configs),
        ruled_out=ruled_out,
        estimate_note=note,
        expected_probes=probes,
        expected_s=min(request.budget_s, probes * per_probe),
    )


def _predicted(estimator: Any, knobs: Knobs) -> int:
    from tuner.errors import TunerError

    try:
        return int(estimator.predict(knobs).calibrated)
    except TunerError:  # no traced point for this checkpointing/precision: not ruled out
        return 0


def real_probe(config: ProbeConfig) -> ProbeResult:
    from tuner.probing.runner import run_probe

    return run_probe(config)


@dataclass(frozen=True)
class BestConfig:
    """A study's best stable config: the knobs, the export in the asked format, and what it changes in your files."""

    study: str
    knobs: dict[str, Any]
    config_key: str
    world_size: int
    gradient_accumulation_steps: int
    format: str
    content: str  # the export, as `tuner best --format FORMAT` prints it
    changes: list[str]  # as `tuner best --changes` prints it
    samples_per_s: float
    objective: float
    confirmed: bool

    def as_dict(self) -> dict[str, Any]:
        """The export parsed (json, deepspeed and hf formats)."""
        parsed: dict[str, Any] = json.loads(self.content)
        return parsed


@dataclass(frozen=True)
class TuneResult:
    study: str
    storage: str
    stop_reason: str  # "budget", "converged", "exhausted", "trials", "interrupted" ... (the search run's)
    best: BestConfig | None  # None: no stable config (more device memory, a longer budget, a smaller space)
    trials: list[ProbeRow] = field(default_factory=list)  # every probe row of the study, inferred ones included
    summary: SearchSummary | None = None

    @property
    def probes(self) -> list[ProbeRow]:
        """The rows of probes that ran (not those ruled out without running)."""
        return [r for r in self.trials if r.measured]


def tune(
    *,
    budget: str | float,
    model: str = DEFAULT_MODEL,
    space: Path | str | Mapping[str, Any] | None = None,
    storage: str | None = None,
    study: str | None = None,
    world_size: int | None = None,
    device_memory: str | int | None = None,
    headroom: float = DEFAULT_HEADROOM,
    global_batch: int | None = None,
    n_trials: int | None = None,
    baseline: Path | str | Mapping[str, Any] | None = None,
    training_args: Path | str | Mapping[str, Any] | None = None,
    lengths: Path | str | Sequence[int] | None = None,
    finalists: int = 2,
    seed: int | None = None,
    estimate: bool | None = None,
    format: str = "json",
    listener: Listener | None = None,
    probe: Probe | None = None,
    **job: Any,
) -> TuneResult:
    """Runs `tuner search` in this process: the same options as keywords (``budget`` a duration like "30m" or
    seconds; ``space``/``baseline``/``training_args`` files or mappings; ``lengths`` a file or token lengths; the job
    settings ``max_length``, ``max_target_length``, ``precision``, ``eval_batch_size``, ``generate``,
    ``generation_max_length``, ``num_beams`` as keywords). Returns the best config exported in ``format``, every
    trial, and why the search stopped. ``probe`` replaces the real probe runner (benchmarks replay recorded tables)."""
    import optuna

    from tuner.search.driver import Search

    unknown = sorted(set(job) - set(JobFlags.__dataclass_fields__))
    if unknown:
        raise ConfigError(f"tune() got unknown settings {', '.join(unknown)}; see help(tuner.tune)")
    request, explicit = prepare_request(
        budget=budget,
        model=model,
        space=space,
        storage=storage,
        study=study,
        world_size=world_size,
        device_memory=device_memory,
        headroom=headroom,
        global_batch=global_batch,
        n_trials=n_trials,
        baseline=baseline,
        training_args=training_args,
        lengths=lengths,
        finalists=finalists,
        seed=seed,
        job_flags=JobFlags(**job),
    )
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if probe is None:
        check_world_size(request)
    store = Store(request.storage)
    request, resumed = resolve(request, explicit, store)
    if probe is None:
        check_host(request, store, resumed)
    runner = Search(request, probe or real_probe)
    attach_estimate(runner, request, estimate)
    if listener is not None:
        runner.listener = listener
    summary = runner.run()
    best = None
    if summary.best is not None:
        best = _best(store, request.study_name, request.definition(), summary.best, format)
    return TuneResult(
        study=request.study_name,
        storage=request.storage,
        stop_reason=summary.stop_reason,
        best=best,
        trials=store.probes(request.study_name),
        summary=summary,
    )


def _best(store: Store, name: str, definition: Mapping[str, Any], found: Candidate, fmt: str) -> BestConfig:
    from tuner.interop.export import best_export_args, render_best
    from tuner.interop.export.changes import best_changes
    from tuner.search.selection import failed_in_production

    rows = store.probes(name)
    base = next((r for r in reversed(rows) if r.fidelity == Fidelity.BASELINE), None)
    args = best_export_args(found, definition)
    changes = best_changes(found, definition, base).lines()
    failed = failed_in_production(rows)
    if failed:
        changes.append(
            f"no longer served: {len(failed)} config{'s' if len(failed) > 1 else ''} whose real training run failed "
            "(see `tuner trials`)"
        )
    return BestConfig(
        study=name,
        knobs=dict(found.knobs),
        config_key=found.config_key,
        world_size=args.world_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        format=fmt,
        content=render_best(fmt, found, definition),
        changes=changes,
        samples_per_s=found.samples_per_s,
        objective=found.objective,
        confirmed=found.confirmed,
    )


def pick_study(store: Store, study: str | None) -> tuple[str, dict[str, Any]]:
    """``study``'s definition, or the most recently created study's when None."""
    if study is not None:
        return study, store.require_study(study)
    rows = store.study_rows()
    if not rows:
        raise StudyNotFound(f"no study in storage {redact_url(store.url)}; run `tuner search --budget 30m` first")
    return rows[0]["name"], dict(rows[0]["definition"])


def best_config(study: str | None = None, storage: str | None = None, format: str = "json") -> BestConfig:
    """The best stable config of ``study`` (the most recent one when None) exported in ``format``
    (json, deepspeed, hf, accelerate, env), as `tuner best` and ``GET /best-config`` hand it out."""
    from tuner.interop.export import FORMATS
    from tuner.search.selection import best_stable, failed_in_production

    if format not in FORMATS:
        raise ConfigError(f"unknown format {format!r}; choose one of {', '.join(FORMATS)}")
    store = Store(load_settings(storage=storage).storage)
    name, definition = pick_study(store, study)
    rows = store.probes(name)
    found = best_stable(rows)
    if found is None:
        failed = failed_in_production(rows)
        why = f" ({len(failed)} whose real training run failed are no longer served)" if failed else ""
        raise NoStableConfig(
            f"study {name!r} has no stable config yet{why}; run `tuner search --study {name}` longer or with more "
            "device memory"
        )
    return _best(store, name, definition, found, format)


def estimate(
    model: str,
    knobs: Knobs | Mapping[str, Any],
    *,
    world_size: int = 1,
    global_batch: int | None = None,
) -> Estimate:
    """The predicted peak device memory per rank of one config (``knobs``: micro_batch_size, max_length, zero_stage
    ...), from a fake-tensor trace of one training step plus DeepSpeed's model-state arithmetic, as `tuner
    estimate` prints it. No GPU needed."""
    from pydantic import ValidationError

    from tuner.job.batching import accumulation_steps
    from tuner.memory.estimator import Estimator, trace

    try:
        k = knobs if isinstance(knobs, Knobs) else Knobs.model_validate(dict(knobs))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first.get("loc", ())) or "knobs"
        raise ConfigError(f"{where}: {first['msg']}") from None
    if global_batch is not None and accumulation_steps(global_batch, k.micro_batch_size, world_size) is None:
        raise ConfigError(
            f"global_batch {global_batch} is not a whole number of micro batches: give a multiple of "
            f"micro_batch_size x world_size = {k.micro_batch_size * world_size}"
        )
    spec = resolve_model(model)
    traced = trace(spec, [(k.micro_batch_size, k.max_length, k.gradient_checkpointing, k.precision)])
    return Estimator(trace=traced, world_size=world_size, global_batch=global_batch).predict(k)
