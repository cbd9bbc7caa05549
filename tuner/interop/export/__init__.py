"""Exports of a tuned configuration: deepspeed (JSON), hf (TrainingArguments kwargs), accelerate (YAML), env, json,
recipe (their TRL recipe back, tuner.interop.export.recipe).

``render(fmt, knobs, world_size=, gradient_accumulation_steps=, baseline=)`` returns the text a user saves; the
``to_*`` functions return the structures. Pure functions: no torch import. ``baseline`` is the user's DeepSpeed JSON
(``tuner.interop.baseline.Baseline.ds_config``), whose optimizer/scheduler/clipping the exports keep; ``fsdp`` the
user's held FSDP2 settings (an FSDP2 pick: accelerate / hf / env, no DeepSpeed JSON).

A study's best config is exported through ``best_export_args`` / ``render_best`` only (`tuner search`'s summary,
`tuner export`, `tuner best`, the HTML report, ``GET /best-config``), so every one hands out the same file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tuner.errors import ConfigError
from tuner.interop.export import layout
from tuner.interop.export.accelerate import DEFAULT_DS_FILE, render_yaml, to_accelerate
from tuner.interop.export.deepspeed import to_deepspeed, validate_knobs
from tuner.interop.export.env import render_env, to_env
from tuner.interop.export.fsdp import NO_DEEPSPEED_JSON, held
from tuner.interop.export.hf import to_hf
from tuner.interop.export.nodes import launch_text
from tuner.interop.export.own import UserFiles, own_deepspeed, own_training_args
from tuner.interop.trainer_fill import TrainerFix, host_transformers, trainer_fill, trainer_fixes
from tuner.records.study import StudyDefinition

FORMATS: tuple[str, ...] = ("json", "deepspeed", "hf", "accelerate", "env", "launch", "recipe")

__all__ = [
    "FORMATS",
    "BestLike",
    "ExportArgs",
    "UserFiles",
    "accelerate_export",
    "best_export_args",
    "deepspeed_export",
    "export_fixes",
    "hf_export",
    "installed_transformers",
    "measured_knobs",
    "render",
    "render_best",
    "to_accelerate",
    "to_deepspeed",
    "to_env",
    "to_hf",
    "to_summary",
]


def deepspeed_export(
    knobs: Mapping[str, Any],
    *,
    world_size: int,
    gradient_accumulation_steps: int,
    baseline: Mapping[str, Any] | None = None,
    files: UserFiles | None = None,
    allow_auto: bool = False,
    transformers_version: str | None = None,
) -> dict[str, Any]:
    """The deepspeed export: to_deepspeed (what the probes ran), as the user's own DeepSpeed file when they gave one
    ("auto" back where they wrote it: a Trainer user's file, the Trainer fills it from the exported training args),
    with the values the Trainer of ``transformers_version`` (None: this host's) needs written explicitly
    (``trainer_fixes``)."""
    if validate_knobs(knobs).engine == "fsdp2":
        raise ConfigError(NO_DEEPSPEED_JSON)
    args = files.training_args if files is not None else None
    ds = to_deepspeed(
        knobs,
        world_size=world_size,
        gradient_accumulation_steps=gradient_accumulation_steps,
        baseline=baseline,
        allow_auto=allow_auto or args is not None,
        training_args=args,
    )
    if files is not None and files.deepspeed is not None:
        ds = own_deepspeed(ds, files.deepspeed, baseline or {}, export_fixes(files, transformers_version))
    return ds


def export_fixes(files: UserFiles | None, transformers_version: str | None) -> list[TrainerFix]:
    """What the exports write so the user's Trainer (``transformers_version``; None: this host's) starts their files
    (tuner.interop.trainer_fill); none without their files."""
    if files is None:
        return []
    return trainer_fixes(files.deepspeed, files.training_args, trainer_fill(transformers_version))


def hf_export(
    knobs: Mapping[str, Any],
    *,
    world_size: int,
    gradient_accumulation_steps: int,
    baseline: Mapping[str, Any] | None = None,
    files: UserFiles | None = None,
    transformers_version: str | None = None,
    job: Mapping[str, Any] | None = None,
    fsdp: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The hf export: the user's own training args with the tuned values when they gave them, else to_hf; with
    the study's ``job``, its generation settings (what the eval generate was probed with); ``fsdp``: the user's held
    FSDP2 settings (an FSDP2 config's fsdp_config)."""
    if files is None or files.training_args is None:
        out = to_hf(
            knobs,
            world_size=world_size,
            gradient_accumulation_steps=gradient_accumulation_steps,
            baseline=baseline,
            transformers_version=transformers_version,
            fsdp=fsdp,
        )
        return {**out, **generation_args(job)}
    k = validate_knobs(knobs)
    ds = None
    if k.engine == "deepspeed":
        ds = deepspeed_export(
            knobs,
            world_size=world_size,
            gradient_accumulation_steps=gradient_accumulation_steps,
            baseline=baseline,
            files=files,
            transformers_version=transformers_version,
        )
    out = own_training_args(
        files.training_args,
        k,
        gradient_accumulation_steps=gradient_accumulation_steps,
        deepspeed=ds,
        transformers_version=transformers_version,
        fixes=export_fixes(files, transformers_version),
        fsdp=held(fsdp),
        # their FSDP lives in their accelerate config unless their args set it (the Trainer's plugin then wins)
        fsdp_in_args=files.accelerate is None or bool(files.training_args.get("fsdp")),
    )
    return {**out, **generation_args(job)}


def accelerate_export(
    knobs: Mapping[str, Any],
    *,
    world_size: int,
    gradient_accumulation_steps: int,
    files: UserFiles | None = None,
    fsdp: Mapping[str, Any] | None = None,
    deepspeed_config_file: str = DEFAULT_DS_FILE,
    nnodes: int = 1,
) -> dict[str, Any]:
    """The accelerate export: the user's own accelerate config when they gave one (their other keys kept), else
    accelerate's local-machine defaults, with the engine, world size, machines and precision of ``knobs``."""
    return to_accelerate(
        knobs,
        world_size=world_size,
        gradient_accumulation_steps=gradient_accumulation_steps,
        deepspeed_config_file=deepspeed_config_file,
        fsdp=fsdp,
        given=files.accelerate if files is not None else None,
        nnodes=nnodes,
    )


def generation_args(job: Mapping[str, Any] | None) -> dict[str, Any]:
    """Seq2SeqTrainingArguments' generation fields of a job that generates (tuner.job.definition.Job as stored):
    the length and beams its eval generate was probed with; nothing when it does not generate or left them unset."""
    if not job or not job.get("generate"):
        return {}
    out: dict[str, Any] = {}
    if job.get("generation_max_length") is not None:
        out["generation_max_length"] = job["generation_max_length"]
    if int(job.get("num_beams") or 1) > 1:
        out["generation_num_beams"] = job["num_beams"]
    return out


def to_summary(
    knobs: Mapping[str, Any],
    *,
    world_size: int,
    gradient_accumulation_steps: int,
    baseline: Mapping[str, Any] | None = None,
    files: UserFiles | None = None,
    transformers_version: str | None = None,
    job: Mapping[str, Any] | None = None,
    fsdp: Mapping[str, Any] | None = None,
    nnodes: int = 1,
) -> dict[str, Any]:
    """The json format: the flat knobs, the batch arithmetic and every other export in one document (an FSDP2
    config's accelerate config in place of a DeepSpeed JSON). A LoRA job's adapters are listed under ``held_fixed``
    (every probe trained them; no export sets them, the user's script builds them with peft)."""
    k = validate_knobs(knobs)
    out: dict[str, Any] = {
        "knobs": k.model_dump(),
        "world_size": world_size,
        "nnodes": nnodes,
        "gradient_accumulation_steps": gradient_accumulation_steps,
        "global_batch": k.micro_batch_size * gradient_accumulation_steps * world_size,
    }
    batch = {"world_size": world_size, "gradient_accumulation_steps": gradient_accumulation_steps}
    if k.engine == "deepspeed":
        out["deepspeed"] = deepspeed_export(
            k.model_dump(),
            **batch,
            baseline=baseline,
            files=files,
            allow_auto=True,
            transformers_version=transformers_version,
        )
    if k.engine == "fsdp2" or nnodes > 1:
        out["accelerate"] = accelerate_export(
            k.model_dump(),
            world_size=world_size,
            gradient_accumulation_steps=gradient_accumulation_steps,
            files=files,
            fsdp=fsdp,
            nnodes=nnodes,
        )
    version = transformers_version
    out["hf"] = hf_export(
        k.model_dump(), **batch, baseline=baseline, files=files, transformers_version=version, job=job, fsdp=fsdp
    )
    out["env"] = to_env(k.model_dump(), **batch, baseline=baseline, fsdp=fsdp, nnodes=nnodes)
    if job and job.get("lora"):
        out["held_fixed"] = {"lora": dict(job["lora"])}
    return out


def render(
    fmt: str,
    knobs: Mapping[str, Any],
    *,
    world_size: int,
    gradient_accumulation_steps: int,
    baseline: Mapping[str, Any] | None = None,
    files: UserFiles | None = None,
    transformers_version: str | None = None,
    job: Mapping[str, Any] | None = None,
    fsdp: Mapping[str, Any] | None = None,
    nnodes: int = 1,
    study: str = "STUDY",
) -> str:
    """The export of ``knobs`` in format ``fmt`` as text (JSON, YAML or shell), ending in a newline. With the user's
    ``files`` the deepspeed, hf and accelerate formats are their own files with only the tuned knobs changed;
    ``fsdp``: the user's held FSDP2 settings, which an FSDP2 config's exports write beside the tuned knobs. An FSDP2
    config has no DeepSpeed JSON: the deepspeed format is a ConfigError saying which formats it has."""
    args: dict[str, Any] = {
        "world_size": world_size,
        "gradient_accumulation_steps": gradient_accumulation_steps,
        "baseline": baseline,
    }
    version = transformers_version
    if fmt == "json":
        summary = to_summary(
            knobs, **args, files=files, transformers_version=version, job=job, fsdp=fsdp, nnodes=nnodes
        )
        return layout.dumps(summary)
    if fmt == "deepspeed":
        return layout.dumps(deepspeed_export(knobs, **args, files=files, transformers_version=version))
    if fmt == "hf":
        return layout.dumps(hf_export(knobs, **args, files=files, transformers_version=version, job=job, fsdp=fsdp))
    if fmt == "recipe":  # their TRL recipe, laid out as they wrote it (a study without one: a ConfigError)
        from tuner.interop.export.recipe import recipe_files, render_recipe, to_recipe

        theirs = recipe_files(files)
        assert theirs.training_args is not None
        tuned = hf_export(knobs, **args, files=theirs, transformers_version=version, job=job, fsdp=fsdp)
        return render_recipe(to_recipe(theirs.training_args, tuned), theirs.training_args_yaml)
    if fmt == "accelerate":
        batch = {k: v for k, v in args.items() if k != "baseline"}
        return render_yaml(accelerate_export(knobs, **batch, files=files, fsdp=fsdp, nnodes=nnodes))
    if fmt == "env":
        return render_env(to_env(knobs, **args, fsdp=fsdp, nnodes=nnodes))
    if fmt == "launch":
        env = {k: v for k, v in to_env(knobs, **args, fsdp=fsdp, nnodes=nnodes).items() if not k.startswith("TUNER_")}
        return launch_text(validate_knobs(knobs), world_size=world_size, nnodes=nnodes, env=env, study=study)
    raise ConfigError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")


class BestLike(Protocol):
    """What an export needs of a study's best config (tuner.records.Candidate has it): the knobs, the probe
    config it was measured with (world_size, gradient_accumulation_steps) and the fingerprints of its probes."""

    @property
    def knobs(self) -> Mapping[str, Any]: ...

    @property
    def config(self) -> Mapping[str, Any]: ...

    @property
    def fingerprints(self) -> Sequence[Mapping[str, Any]]: ...


@dataclass(frozen=True)
class ExportArgs:
    """The batch arithmetic, the user's DeepSpeed source and files an export of a best config is rendered with."""

    world_size: int
    gradient_accumulation_steps: int
    baseline: Mapping[str, Any] | None
    files: UserFiles | None = None
    transformers_version: str | None = None
    job: Mapping[str, Any] | None = None  # the study's job (tuner.job.definition.Job as stored)
    fsdp: Mapping[str, Any] | None = None  # the user's held FSDP2 settings (trials.contract.FsdpSettings as JSON)
    nnodes: int = 1  # the nodes the pick was measured across

    def kwargs(self) -> dict[str, Any]:
        return {
            "world_size": self.world_size,
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
            "baseline": self.baseline,
            "files": self.files,
            "transformers_version": self.transformers_version,
            "job": self.job,
            "fsdp": self.fsdp,
            "nnodes": self.nnodes,
        }


def installed_transformers() -> str | None:
    """The installed transformers version (the exports name TrainingArguments fields as it does), None without it."""
    return host_transformers()


def best_export_args(
    best: BestLike, definition: StudyDefinition | Mapping[str, Any], transformers_version: str | None = None
) -> ExportArgs:
    """World size and accumulation from the config the best candidate was measured with (the study definition's
    world size, else 1, where the stored config lacks it); the baseline's DeepSpeed JSON from the study definition
    (``baseline_source``), whose optimizer, scheduler and clipping the export keeps. ``transformers_version``: the
    training host's (the hf export names its fields and fills as that version does); None: the one the study's
    baseline was filled for (``tuner search --transformers-version``), else this host's."""
    d = StudyDefinition.of(definition)
    stored = (d.trainer or {}).get("transformers")
    source = d.baseline_source
    return ExportArgs(
        world_size=int(best.config.get("world_size") or d.world_size or 1),
        gradient_accumulation_steps=int(best.config.get("gradient_accumulation_steps") or 1),
        baseline=source if isinstance(source, Mapping) else None,
        files=UserFiles.of(d.baseline_files),
        transformers_version=transformers_version or (str(stored) if stored else None) or installed_transformers(),
        job=d.job,
        fsdp=d.fsdp,
        nnodes=int(best.config.get("nnodes") or d.nnodes or 1),
    )


def measured_knobs(best: BestLike) -> dict[str, Any]:
    """The knobs as the best config's probes ran them. With the alloc_conf knob unset, every probe ran with the
    allocator settings of the worker's shell (the probe fingerprint's ``alloc_conf``); when they all agree on one,
    it is part of what was measured, so the export carries it."""
    knobs = dict(best.knobs)
    if not knobs.get("alloc_conf"):
        inherited = {str(fp.get("alloc_conf") or "") for fp in best.fingerprints}
        if len(inherited) == 1 and (value := inherited.pop()):
            knobs["alloc_conf"] = value
    return knobs


def render_best(
    fmt: str,
    best: BestLike,
    definition: StudyDefinition | Mapping[str, Any],
    transformers_version: str | None = None,
    study: str = "STUDY",
) -> str:
    """A study's best config in format ``fmt``, as every command and the API hand it out (for the training host's
    ``transformers_version``; None: this host's)."""
    args = best_export_args(best, definition, transformers_version).kwargs()
    return render(fmt, measured_knobs(best), **args, study=study)
