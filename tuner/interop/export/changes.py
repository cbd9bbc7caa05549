"""What the export changes in the user's files, what it held fixed, and how it compares with their config.

``tuner best --changes``, ``GET /best-config`` (``changes``) and the report all read ``changes_of``: each changed key
old -> new (a diff of the user's files against the exports of the best config, so it is exactly what changed), the
job held fixed, the keys carried without being probed, and the verdict on the baseline probe: the speed-up, or where
and at what size the user's config ran out of memory. Pure functions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from trials.contract import DS_HOST_KEYS, FSDP_KNOBS
from tuner.interop.export import (
    BestLike,
    ExportArgs,
    accelerate_export,
    best_export_args,
    deepspeed_export,
    export_fixes,
    hf_export,
    measured_knobs,
)
from tuner.interop.export.own import UserFiles, checkpointing_key
from tuner.job.objective import Objective
from tuner.job.space import ZERO_KNOBS
from tuner.records.probe import ProbeRow
from tuner.records.study import StudyDefinition
from tuner.records.throughput import Throughput, config_throughput, speedup_text, throughput
from tuner.units import format_size

_UNSET = object()
DROPPED_DEEPSPEED = "(your DeepSpeed config)"  # what a pick on another engine removes from their training args


@dataclass(frozen=True)
class Change:
    file: str  # "training args" | "deepspeed" | "accelerate config" | "knobs"
    key: str  # dotted path in that file
    old: Any  # None with ``added``: the key was not in the user's file
    new: Any  # None with ``removed``
    added: bool = False
    removed: bool = False
    why: str | None = None  # a change made for the user's Trainer, not tuned (tuner.interop.trainer_fill)

    def line(self) -> str:
        old = "(unset)" if self.added else repr(self.old)
        new = "(removed)" if self.removed else repr(self.new)
        return f"{self.file}: {self.key}: {old} -> {new}" + (f" (for your Trainer: {self.why})" if self.why else "")


@dataclass(frozen=True)
class Changes:
    changes: list[Change] = field(default_factory=list)
    fixed: str | None = None  # the job, held fixed (tuner.job.definition.Job.describe)
    not_probed: list[str] = field(default_factory=list)  # the user's keys the export carries but no probe ran
    verdict: str | None = None  # against the baseline probe
    written_for: str | None = None  # which transformers the training-args export names its fields for
    engine: str | None = None  # the pick's engine, and the user's when it differs (engine_line)
    kept: list[str] = field(default_factory=list)  # their keys kept as written that change neither (the ledger)

    def lines(self) -> list[str]:
        out = [self.engine] if self.engine else []
        out += [c.line() for c in self.changes] or ["no change to your files"]
        if self.fixed:
            out.append(f"held fixed (your job): {self.fixed}")
        if self.not_probed:
            out.append(f"carried, not probed: {', '.join(self.not_probed)} (probes run without them)")
        if self.kept:
            out.append(
                f"kept as you wrote them, neither memory nor speed (tuner's ledger): {', '.join(self.kept)}; every "
                "other field of your files was probed as your Trainer runs it"
            )
        if self.verdict:
            out.append(self.verdict)
        if self.written_for:
            out.append(self.written_for)
        return out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def diff(old: Any, new: Any, file: str, prefix: str = "") -> list[Change]:
    """Every key whose value differs between two nested JSON objects (lists compare as values), in ``new``'s order
    then the removed ones."""
    if not (isinstance(old, Mapping) and isinstance(new, Mapping)):
        return [] if old == new else [Change(file, prefix.rstrip("."), old, new)]
    out: list[Change] = []
    for key, value in new.items():
        path = f"{prefix}{key}"
        before = old.get(key, _UNSET)
        if before is _UNSET:
            out.append(Change(file, path, None, value, added=True))
        else:
            out += diff(before, value, file, f"{path}.")
    out += [Change(file, f"{prefix}{key}", value, None, removed=True) for key, value in old.items() if key not in new]
    return out


def verdict(
    baseline: Any | None, pick: Throughput | None, base: Throughput | None, unit: str = "samples/s"
) -> str | None:
    """The best config against the baseline probe (a ProbeRow, or None without a baseline): with both figures
    (tuner.records.throughput: the median of each config's probes) the speed-up and the two numbers it divides."""
    if baseline is None:
        return None
    status = str(baseline.status)
    if status == "ok":
        if pick is None or base is None:
            return None
        speed = speedup_text(pick, base, unit)
        return speed + ("" if baseline.stable else "; yours ran above the memory headroom")
    if status == "oom":
        measured = baseline.measurement
        phase = measured.phase or "an unknown phase"
        need = max((r.oom_need or r.peak_allocated for r in measured.ranks), default=0)
        size = f", needing at least {format_size(need)}" if need else ""
        return f"your config ran out of memory in its {phase} step{size}; this one fits"
    if status == "refused":  # never launched: DeepSpeed or their Trainer refuses it as it stands
        return f"your config cannot start as it stands ({baseline.cause or 'no cause recorded'}); this one runs"
    return f"your config did not complete its probe ({status}: {baseline.cause or 'no cause recorded'})"


def changes_of(
    files: UserFiles | None,
    exported: Mapping[str, Mapping[str, Any] | None],
    *,
    job: str | None,
    baseline: Any | None,
    pick: Throughput | None = None,
    base: Throughput | None = None,
    unit: str = "samples/s",
    tuned_without_files: Sequence[Change] = (),
) -> Changes:
    """The changes of the user's ``files`` to the ``exported`` ones ({"training args": ..., "deepspeed": ...,
    "accelerate": ...}; the training args' inline deepspeed section is compared as the deepspeed file, and listed as
    removed when the pick runs another engine). Without files (no baseline): ``tuned_without_files``."""
    changes: list[Change] = []
    not_probed: list[str] = []
    if files is None:
        changes = list(tuned_without_files)
    else:
        if files.training_args is not None and exported.get("training args") is not None:
            old_args = {k: v for k, v in files.training_args.items() if k != "deepspeed"}
            new_args = {k: v for k, v in dict(exported["training args"] or {}).items() if k != "deepspeed"}
            changes += diff(old_args, new_args, "training args")
            if "deepspeed" in files.training_args and "deepspeed" not in dict(exported["training args"] or {}):
                changes.append(Change("training args", "deepspeed", DROPPED_DEEPSPEED, None, removed=True))
        if exported.get("deepspeed") is not None:
            changes += diff(files.deepspeed or {}, exported["deepspeed"], "deepspeed")
        if files.accelerate is not None and exported.get("accelerate") is not None:
            changes += diff(files.accelerate, exported["accelerate"], "accelerate config")
        not_probed = sorted(k for k in (files.deepspeed or {}) if k in DS_HOST_KEYS)
    return Changes(
        changes=changes,
        fixed=job,
        not_probed=not_probed,
        verdict=verdict(baseline, pick, base, unit),
    )


def _their_args(knobs: Mapping[str, Any], args: ExportArgs) -> tuple[Mapping[str, Any] | None, bool]:
    """The export of the user's training args (None: they gave none), and whether they are a TRL recipe: then laid
    out as the recipe format writes it (their keys, checkpointing under their name), so the changes speak in their
    keys; other training args as the hf export writes them."""
    from tuner.interop.export.recipe import to_recipe
    from tuner.job.ledger.trl import read_recipe

    files = args.files
    if files is None or files.training_args is None:
        return None, False
    out = hf_export(
        knobs,
        world_size=args.world_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        baseline=args.baseline,
        files=files,
        transformers_version=args.transformers_version,
        job=args.job,
        fsdp=args.fsdp,
    )
    try:
        recipe = read_recipe(files.training_args).kind is not None
    except ValueError:
        recipe = False
    return (to_recipe(files.training_args, out), True) if recipe else (out, False)


def _searched(choices: Any) -> bool:
    """A knob the space let the search choose: more than one value (or a range); unknown: assume so."""
    return not isinstance(choices, list) or len(choices) > 1


def best_changes(
    best: BestLike,
    definition: StudyDefinition | Mapping[str, Any],
    baseline: Any | None,
    transformers_version: str | None = None,
    rows: Sequence[ProbeRow] = (),
) -> Changes:
    """The changes of a study's best config (``best``: a selection Candidate) to the user's files, as ``tuner best
    --changes``, ``GET /best-config`` and the report show them; ``baseline``: the study's baseline probe row;
    ``transformers_version``: the training host's (None: this host's); ``rows``: the study's probe rows (the
    baseline's figure is the median of its config's probes, as the other faces show it)."""
    d = StudyDefinition.of(definition)
    args = best_export_args(best, d, transformers_version)
    knobs = measured_knobs(best)
    world, accum, files = args.world_size, args.gradient_accumulation_steps, args.files
    exported: dict[str, Mapping[str, Any] | None] = {"training args": None, "deepspeed": None, "accelerate": None}
    exported["training args"], recipe = _their_args(knobs, args)
    if files is not None and files.accelerate is not None:
        exported["accelerate"] = accelerate_export(
            knobs, world_size=world, gradient_accumulation_steps=accum, files=files, fsdp=args.fsdp
        )
    if knobs.get("engine", "deepspeed") == "deepspeed":
        exported["deepspeed"] = deepspeed_export(
            knobs,
            world_size=world,
            gradient_accumulation_steps=accum,
            baseline=args.baseline,
            files=files,
            allow_auto=True,
            transformers_version=args.transformers_version,
        )
    job = d.job
    fixed = None
    if job is not None:
        from tuner.job.definition import Job

        held = Job.model_validate(job)
        fixed = held.describe()
        if held.lora is not None:
            fixed += "; no export sets the adapters: your script builds them (peft), as every probe did"
        searched = list(d.job_changes)
        if searched:
            fixed += f" (searched on purpose, as the space file lists: {', '.join(searched)})"
        objective = Objective.from_dict(d.objective)
        cut = objective.truncation(int(knobs["max_length"])) if "max_length" in searched else None
        if cut is not None:  # a truncation the search chose is a change to their job: say what it cuts of their data
            fixed += f"; the pick's max_length {knobs['max_length']} is a change to your job: on your data it {cut}"
    space: Mapping[str, Any] = d.space or {}
    tuned = [  # without a baseline to compare with: the knobs the search chose (those the space gave a choice)
        Change("knobs", name, None, value, added=True)
        for name, value in knobs.items()
        if value is not None and _searched(space.get(name)) and applies(name, knobs)
    ]
    found = changes_of(
        args.files,
        exported,
        job=fixed,
        baseline=baseline,
        pick=throughput(getattr(best, "rows", ())),
        base=config_throughput(rows, baseline) if isinstance(baseline, ProbeRow) else None,
        unit=Objective.from_dict(d.objective).unit,
        tuned_without_files=tuned,
    )
    why = {(f.file, f.key): f.why for f in export_fixes(files, args.transformers_version)}
    found = replace(found, changes=[replace(c, why=why.get((c.file, c.key))) for c in found.changes])
    found = replace(found, engine=engine_line(knobs, d.baseline), kept=neutral_keys(files, args.transformers_version))
    if d.files_global_batch is not None:  # a change they asked for (--change-global-batch): said with the others
        batch = Change("your job", "global batch (micro x accumulation x world)", d.files_global_batch, d.global_batch)
        found = replace(found, changes=[batch, *found.changes])
    if exported["training args"] is None:
        return found
    line = written_for(args.transformers_version)
    if recipe:
        line = f"changes in your TRL recipe's keys (--format recipe writes them back); the hf format's {line}"
    return replace(found, written_for=line)


def neutral_keys(files: UserFiles | None, transformers_version: str | None) -> list[str]:
    """Their keys the ledger calls neutral (tuner.job.ledger: logging, hub, output paths ...), kept as written."""
    if files is None:
        return []
    from tuner.errors import BaselineError
    from tuner.job.ledger.accelerate import read_accelerate
    from tuner.job.ledger.deepspeed import read_deepspeed
    from tuner.job.ledger.held import read_training_args

    kept: list[str] = []
    if files.training_args is not None:
        kept += sorted(read_training_args(files.training_args, transformers_version, strict=False).neutral)
    try:
        kept += sorted(read_deepspeed(files.deepspeed or {}))
        kept += sorted(read_accelerate(files.accelerate).kept) if files.accelerate is not None else []
    except BaselineError:  # stored before the ledger refused it: nothing to add
        pass
    return kept


def applies(name: str, knobs: Mapping[str, Any]) -> bool:
    """Whether knob ``name`` means anything for the config's engine (the space samples ZeRO knobs for DeepSpeed only,
    the FSDP ones for FSDP2 only: a space listing them gave no choice to another engine's pick)."""
    engine = knobs.get("engine", "deepspeed")
    if name == "zero_stage" or name in ZERO_KNOBS:
        return engine == "deepspeed"
    return name not in FSDP_KNOBS or engine == "fsdp2"


def engine_name(knobs: Mapping[str, Any]) -> str:
    """The engine of a config in words: DeepSpeed ZeRO-n, FSDP2 through accelerate, or plain PyTorch."""
    engine = knobs.get("engine", "deepspeed")
    if engine == "fsdp2":
        return "FSDP2 (PyTorch fully_shard through accelerate, fsdp_version 2)"
    if engine == "deepspeed":
        return f"DeepSpeed ZeRO-{int(knobs.get('zero_stage') or 0)}"
    return "plain PyTorch (DDP)"


def engine_line(knobs: Mapping[str, Any], baseline: Mapping[str, Any] | None) -> str:
    """The pick's engine, and the user's config's when it runs another one (whose files the exports then leave)."""
    line = f"engine: {engine_name(knobs)}"
    if baseline and baseline.get("engine", "deepspeed") != knobs.get("engine", "deepspeed"):
        line += f"; your config runs {engine_name(baseline)}"
        if knobs.get("engine") == "fsdp2":
            line += ": no DeepSpeed JSON for this pick (its training args and accelerate config configure FSDP2)"
    return line


def written_for(transformers_version: str | None) -> str:
    """The line saying which transformers the training-args export was written for."""
    key = checkpointing_key(transformers_version)
    return (
        f"training args written for transformers {transformers_version or '(unknown)'} (checkpointing as {key}); "
        "give your training host's with --transformers-version"
    )
