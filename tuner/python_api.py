"""The Python API: ``tuner.tune(...)``, ``tuner.best_config(...)``, ``tuner.estimate(...)``.

``tune`` is a search session (tuner.session.session.SearchSession), the one `tuner search` renders; its keywords are
the declared settings (tuner.session.options.SearchOptions, tuner.job.definition.JobFlags), the same ones `tuner
search` has as options. ``best_config`` is tuner.session.best.serve_best, the one `tuner best` and ``GET /best-config``
use. Every mistake is a typed exception from tuner.errors with the one line the CLI prints. ``tune`` is named so
because ``tuner.search`` is the search package.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field
from typing import TYPE_CHECKING, Any

from trials.contract import Knobs, ProbeConfig, ProbeResult
from tuner.declared import TUNE, Declared, declared
from tuner.errors import ConfigError
from tuner.job.definition import JobFlags
from tuner.job.model_source import resolve_local_model
from tuner.records import ProbeRow
from tuner.session.options import DEFAULT_MODEL, SearchOptions
from tuner.settings import load_settings
from tuner.storage import Store

if TYPE_CHECKING:
    from tuner.memory.estimator import Estimate
    from tuner.session.best import ServedBest
    from tuner.session.driver import SearchSummary

__all__ = ["DEFAULT_MODEL", "BestConfig", "TuneResult", "best_config", "estimate", "tune"]
Probe = Callable[[ProbeConfig], ProbeResult]


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

    @classmethod
    def of(cls, served: ServedBest) -> BestConfig:
        found, args = served.best, served.export_args
        return cls(
            study=served.study,
            knobs=dict(found.knobs),
            config_key=found.config_key,
            world_size=args.world_size,
            gradient_accumulation_steps=args.gradient_accumulation_steps,
            format=served.format,
            content=served.content,
            changes=served.change_lines,
            samples_per_s=served.throughput.samples_per_s,
            objective=served.throughput.value,
            confirmed=found.confirmed,
        )

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


#: tune()'s keywords that are not search settings: how it runs and what it hands back
RUN_KEYWORDS = {"format": "json", "listener": None, "probe": None}


def _settings() -> list[Declared]:
    return declared(SearchOptions, TUNE) + declared(JobFlags, TUNE)


def tune(**settings: Any) -> TuneResult:
    """Runs `tuner search` in this process; returns the best config exported in ``format`` (json, deepspeed, hf,
    accelerate, env), every trial, and why the search stopped. ``budget`` is a duration like "30m" or seconds;
    ``space``, ``baseline`` and ``training_args`` are files or mappings; ``lengths`` a file or token lengths;
    ``lora_target_modules`` "q_proj,v_proj" or a list. ``listener`` is told of every probe (a
    tuner.session.driver.Listener); ``probe`` replaces the real probe runner (and the host checks), e.g. to replay
    recorded tables. Every setting, as `tuner search --help` lists it, is below.

    Example (real probes of the built-in tiny T5 on CPU, on an emulated 160 MiB device; a minute or two)::

        >>> import tuner
        >>> result = tuner.tune(
        ...     budget="10m", storage="sqlite:///tuner.db", study="quick", device_memory="160MiB",
        ...     space={"micro_batch_size": [2, 32], "zero_stage": [0], "gradient_checkpointing": [False]},
        ... )
        >>> result.best.knobs["micro_batch_size"], result.best.gradient_accumulation_steps
        (2, 16)
        >>> result.best.confirmed  # re-probed longer before the pick
        True
    """
    from tuner.session.best import serve_best
    from tuner.session.session import ListenerEvents, SearchSession

    known = {d.name for d in _settings()} | set(RUN_KEYWORDS)
    unknown = sorted(set(settings) - known)
    if unknown:
        raise ConfigError(f"tune() got unknown settings {', '.join(unknown)}; see help(tuner.tune)")
    bound = _SIGNATURE.bind(**settings)  # a missing budget: TypeError, as for any required keyword
    bound.apply_defaults()
    values = dict(bound.arguments)
    fmt, listener, probe = (values.pop(k) for k in RUN_KEYWORDS)
    values["given"] = frozenset(settings)  # the keywords passed, even at their default (as the command line's)
    session = SearchSession(SearchOptions.of(values), probe=probe, events=ListenerEvents(listener))
    ran = session.run()
    name, summary = ran.request.study_name, ran.summary
    rows = ran.store.probes(name)
    best = None
    if summary.best is not None:  # the pick the run ended with
        best = BestConfig.of(serve_best(ran.store, name, fmt, ranked=(rows, summary.best)))
    return TuneResult(
        study=name,
        storage=ran.request.storage,
        stop_reason=summary.stop_reason,
        best=best,
        trials=rows,
        summary=summary,
    )


def _signature() -> inspect.Signature:
    """tune()'s keywords, from the settings' declarations (tuner.declared), then RUN_KEYWORDS."""
    params = [
        inspect.Parameter(
            d.name,
            inspect.Parameter.KEYWORD_ONLY,
            default=inspect.Parameter.empty if d.default is MISSING else d.default,
            annotation=d.type,
        )
        for d in _settings()
    ]
    hints = {"format": str, "listener": "Listener | None", "probe": "Probe | None"}
    params += [
        inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=v, annotation=hints[k])
        for k, v in RUN_KEYWORDS.items()
    ]
    return inspect.Signature(params, return_annotation=TuneResult)


def _settings_doc() -> str:
    lines = ["", "    Settings (the same as `tuner search`'s options):", ""]
    for d in _settings():
        default = "required" if d.required else f"default {d.default!r}"
        lines.append(f"    - ``{d.name}`` ({default}): {d.spec.help}")
    return "\n".join(lines) + "\n"


_SIGNATURE = _signature()
tune.__signature__ = _SIGNATURE  # type: ignore[attr-defined]
tune.__doc__ = (tune.__doc__ or "") + _settings_doc()


def best_config(study: str | None = None, storage: str | None = None, format: str = "json") -> BestConfig:
    """The best stable config of ``study`` (the most recent one when None) exported in ``format``
    (json, deepspeed, hf, accelerate, env), as `tuner best` and ``GET /best-config`` hand it out.

    Example (the study of the ``tune`` example)::

        >>> best = tuner.best_config("quick", storage="sqlite:///tuner.db", format="hf")
        >>> best.as_dict()["per_device_train_batch_size"], best.as_dict()["gradient_accumulation_steps"]
        (2, 16)
        >>> for line in best.changes:  # `tuner best --changes`: without --baseline, the knobs it sets
        ...     print(line)
        engine: DeepSpeed ZeRO-0
        knobs: micro_batch_size: (unset) -> 2
        knobs: overlap_comm: (unset) -> False
        knobs: offload_optimizer: (unset) -> False
        held fixed (your job): fp32, length 128, no eval step
    """
    from tuner.session.best import serve_best

    store = Store(load_settings(storage=storage).storage)
    return BestConfig.of(serve_best(store, study, format))


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
    estimate` prints it; with ``lora_r`` (and the other lora_* of ``tune``) for a LoRA job. No GPU needed.

    Example (a few seconds on CPU)::

        >>> import tuner
        >>> small = tuner.estimate("builtin:tiny-t5", {"micro_batch_size": 2, "max_length": 128, "zero_stage": 0})
        >>> large = tuner.estimate("builtin:tiny-t5", {"micro_batch_size": 16, "max_length": 128, "zero_stage": 0})
        >>> small.raw < large.raw, small.states.params == large.states.params  # activations grow, params do not
        (True, True)
        >>> small.fits(160 * 2**20)  # bytes per rank
        True
    """
    from tuner.job.batching import GLOBAL_BATCH_KEYWORDS, validated_knobs
    from tuner.job.lora import check_lora, lora_spec
    from tuner.memory.estimator import Estimator, trace, trace_at

    k = validated_knobs(knobs, global_batch, world_size, GLOBAL_BATCH_KEYWORDS)
    spec = resolve_local_model(model)
    lora = lora_spec(lora_r, lora_alpha, lora_dropout, lora_target_modules, lora_bias)
    if lora is not None:
        check_lora(spec, lora)
    traced = trace(spec, [trace_at(k)], lora=lora)
    return Estimator(trace=traced, world_size=world_size, global_batch=global_batch).predict(k)
