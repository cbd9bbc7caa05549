"""The Python API: ``tuner.tune(...)``, ``tuner.best_config(...)``, ``tuner.estimate(...)``.

`tuner search`, `tuner best` and `tuner estimate` are thin layers over these: the CLI parses its options into the
same record (tuner.session.options.SearchOptions) and calls ``resolve`` / ``check_host`` / ``real_probe`` from here.
Every mistake is a typed exception from tuner.errors with the one line the CLI prints. ``tune`` is named so because
``tuner.search`` is the search package.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trials.contract import Knobs, ProbeConfig, ProbeResult
from tuner.errors import ConfigError, NoStableConfig, StudyNotFound
from tuner.job.definition import JobFlags
from tuner.job.model_source import resolve_model
from tuner.records import DEFAULT_HEADROOM, Fidelity, ProbeRow
from tuner.session.options import DEFAULT_MODEL, SearchOptions, prepare_request
from tuner.search.request import SearchRequest, check_resume, request_from_definition
from tuner.settings import load_settings, redact_url
from tuner.storage import Store

if TYPE_CHECKING:
    from tuner.memory.estimator import Estimate
    from tuner.records import Candidate
    from tuner.session.driver import Listener, Search, SearchSummary

__all__ = ["DEFAULT_MODEL", "BestConfig", "TuneResult", "best_config", "estimate", "tune"]
Probe = Callable[[ProbeConfig], ProbeResult]


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
    """Before the first probe: the study's host record (GPU and library versions, tuner.session.host_record) must
    match this host's; a study from before the record is compared by its first probe's GPU type instead (unless
    its device memory is fixed: a frontier learned on one device's limits must not rule another's); a multi-rank
    search on GPUs passes the NCCL preflight (all ranks, one all_reduce and a barrier, 90 s). ConfigError with one
    line if not."""
    import tempfile

    from tuner.probing import gpus
    from tuner.session.host_record import check_host_record

    recorded = check_host_record(store, request.study_name, request.device_memory is not None, resumed)
    visible, physical, _ = gpus.host_visible_devices()
    if not (physical and visible):
        return
    if resumed and not recorded:
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
    ``generation_max_length``, ``num_beams``, and for a LoRA job ``lora_r``, ``lora_alpha``, ``lora_dropout``,
    ``lora_target_modules`` ("q_proj,v_proj" or a list), ``lora_bias`` as keywords). Returns the best config exported
    in ``format``, every trial, and why the search stopped. ``probe`` replaces the real probe runner (benchmarks
    replay recorded tables)."""
    import optuna

    from tuner.session.driver import Search

    unknown = sorted(set(job) - set(JobFlags.__dataclass_fields__))
    if unknown:
        raise ConfigError(f"tune() got unknown settings {', '.join(unknown)}; see help(tuner.tune)")
    options = SearchOptions(
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
    request, explicit = prepare_request(options)
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
    lora_r: int | None = None,
    lora_alpha: int | None = None,
    lora_dropout: float | None = None,
    lora_target_modules: str | Sequence[str] | None = None,
    lora_bias: str | None = None,
) -> Estimate:
    """The predicted peak device memory per rank of one config (``knobs``: micro_batch_size, max_length, zero_stage
    ...), from a fake-tensor trace of one training step plus DeepSpeed's model-state arithmetic, as `tuner
    estimate` prints it; with ``lora_r`` (and the other lora_* of ``tune``) for a LoRA job. No GPU needed."""
    from pydantic import ValidationError

    from tuner.job.batching import accumulation_steps
    from tuner.job.lora import check_lora, lora_spec
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
    lora = lora_spec(lora_r, lora_alpha, lora_dropout, lora_target_modules, lora_bias)
    if lora is not None:
        check_lora(spec, lora)
    traced = trace(spec, [(k.micro_batch_size, k.max_length, k.gradient_checkpointing, k.precision)], lora=lora)
    return Estimator(trace=traced, world_size=world_size, global_batch=global_batch).predict(k)
