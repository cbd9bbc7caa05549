"""How the user's transformers fills the DeepSpeed "auto" values that differ between releases, and the fix an export
carries where their Trainer would hand DeepSpeed a value it refuses. Pure: no torch import.

Read in the releases' own sources (transformers.integrations.deepspeed.HfTrainerDeepSpeedConfig.trainer_config_finalize
and TrainingArguments.get_warmup_steps):

- ``scheduler.params.warmup_num_steps: "auto"`` is filled with ``args.get_warmup_steps(num_training_steps)``;
  transformers 4.x: ``warmup_steps`` when > 0, else ``ceil(num_training_steps * warmup_ratio)``; 5.x: ``warmup_steps``
  itself when >= 1, else ``ceil(num_training_steps * warmup_steps)`` (a ratio below 1). From 5.18 the fill is clamped
  with ``max(1, ...)``; up to 5.17 (and every 4.x, 4.57.3 too) it is not: 0 by default.
- DeepSpeed from 0.19.3 refuses a non-positive ``warmup_num_steps`` when deepspeed.initialize builds WarmupLR,
  WarmupDecayLR or WarmupCosineLR ("warmup_num_steps must be a positive integer, got 0"); before, it clamped it to 2.

So a Trainer on transformers <= 5.17 beside deepspeed >= 0.19.3 dies at its first step on a config with warmup 0. The
fix (``trainer_fixes``) is what newer transformers runs: warmup 1, in the DeepSpeed file and in the training args (a
Trainer of any release checks the two against each other). It changes no schedule: DeepSpeed runs at least 2 warm-up
steps either way (``max(2, warmup_num_steps)``).
"""

from __future__ import annotations

import importlib.metadata
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from trials.contract import AUTO
from tuner.errors import ConfigError

#: the first transformers release whose Trainer clamps the warmup it fills to at least 1
WARMUP_CLAMPED_SINCE = (5, 18)
#: the first DeepSpeed release that refuses warmup_num_steps < 1 (read in its sdists: 0.19.2 clamps, 0.19.3 refuses)
DEEPSPEED_REFUSES_SINCE = "0.19.3"
WARMUP_PATH: tuple[str, ...] = ("scheduler", "params", "warmup_num_steps")
WARMUP_ARG = "warmup_steps"  # the TrainingArguments field the Trainer fills it from (and checks it against)
FIXED_WARMUP = 1


def parse_version(version: str | None) -> tuple[int, int] | None:
    """(major, minor) of a version string such as "5.17.0" or "4.46.3"; None when it is not one."""
    match = re.match(r"^\s*(\d+)\.(\d+)", str(version or ""))
    return (int(match.group(1)), int(match.group(2))) if match else None


def checked_version(version: str | None, option: Callable[[str], str] = str) -> str | None:
    """A training host's transformers version as given, stripped (None: this host's); a ConfigError naming the
    setting as the caller spells it (``option``) when it is not one."""
    if version is None:
        return None
    if parse_version(version) is None:
        raise ConfigError(
            f"{option('transformers_version')} {version!r} is not a version; give your training host's, e.g. 4.46.3"
        )
    return version.strip()


def host_transformers() -> str | None:
    """This host's transformers version (package metadata; no import), None without it."""
    try:
        return importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class TrainerFill:
    """The fill rules of one transformers release (``version``; None: unknown, read as the newest rules)."""

    version: str | None
    clamps_warmup: bool  # max(1, ...) around the warmup it fills (5.18 on)
    warmup_ratio_field: bool  # 4.x: a separate warmup_ratio; 5.x: warmup_steps below 1 is the ratio

    @property
    def named(self) -> str:
        return f"transformers {self.version or '(unknown)'}"

    def warmup(self, args: Mapping[str, Any], num_training_steps: int | None) -> int | None:
        """What this release fills ``warmup_num_steps: "auto"`` with from training args ``args`` (TrainingArguments'
        defaults for what they leave out); None when it depends on a number of training steps not known here (a
        ratio without max_steps: then it is at least 1)."""
        steps = args.get(WARMUP_ARG, 0)
        ratio = args.get("warmup_ratio", 0.0) if self.warmup_ratio_field else steps
        if not isinstance(steps, (int, float)) or isinstance(steps, bool):
            return None
        whole = steps > 0 if self.warmup_ratio_field else steps >= 1  # 4.x: any steps; 5.x: below 1 is a ratio
        if whole:
            filled = int(steps)
        elif not isinstance(ratio, (int, float)) or isinstance(ratio, bool):
            return None
        elif ratio == 0:
            filled = 0  # ceil(n * 0): whatever the number of steps
        elif num_training_steps is None:
            return None
        else:
            filled = math.ceil(num_training_steps * ratio)
        return max(1, filled) if self.clamps_warmup else filled

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def trainer_fill(version: str | None) -> TrainerFill:
    """The fill rules of transformers ``version`` (a release string; None: this host's). An unknown or unparsable
    version reads as the newest rules."""
    version = version if version is not None else host_transformers()
    parsed = parse_version(version)
    if parsed is None:
        return TrainerFill(version, clamps_warmup=True, warmup_ratio_field=False)
    return TrainerFill(version, clamps_warmup=parsed >= WARMUP_CLAMPED_SINCE, warmup_ratio_field=parsed[0] < 5)


@dataclass(frozen=True)
class TrainerFix:
    """One value an export writes so the user's Trainer starts: ``file`` ("deepspeed" | "training args"), the
    dotted ``key``, its value in their file (``old``; None: not in it), the value their Trainer hands DeepSpeed from
    it (``runs``: "auto" filled), the one written (``new``), and why."""

    file: str
    key: str
    old: Any
    runs: Any
    new: Any
    why: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainerFix:
        file, key, why = str(data["file"]), str(data["key"]), str(data["why"])
        return cls(file, key, data.get("old"), data.get("runs"), data["new"], why)


def _why(fill: TrainerFill, filled: int, auto: bool) -> str:
    source = (
        f"{fill.named} fills warmup_num_steps 'auto' with warmup_steps"
        f"{' (else warmup_ratio)' if fill.warmup_ratio_field else ''} unclamped ({filled}; 5.18 on clamp to 1)"
        if auto
        else f"your DeepSpeed file sets warmup_num_steps {filled}"
    )
    return (
        f"{source} and deepspeed >= {DEEPSPEED_REFUSES_SINCE} refuses it at deepspeed.initialize "
        f'("warmup_num_steps must be a positive integer, got {filled}"); {FIXED_WARMUP} is what newer transformers '
        "runs, the same schedule (DeepSpeed warms up over at least 2 steps either way)"
    )


def trainer_fixes(
    ds: Mapping[str, Any] | None,
    args: Mapping[str, Any] | None,
    fill: TrainerFill,
    num_training_steps: int | None = None,
) -> list[TrainerFix]:
    """The values an export writes so ``fill``'s Trainer starts the user's DeepSpeed file ``ds`` (as given: "auto"
    kept) with their training ``args`` (as given; None: none): where the warmup DeepSpeed would receive is below 1,
    warmup 1 in the DeepSpeed file and, with training args, ``warmup_steps: 1`` too (the Trainer checks an explicit
    DeepSpeed value against them). Empty when nothing needs it."""
    from tuner.interop.export.mapping import get_path  # here: the export package imports this module

    given = get_path(ds or {}, WARMUP_PATH)
    if given is None:
        return []
    auto = given == AUTO
    if auto:
        if args is None:
            return []
        max_steps = args.get("max_steps")
        steps = max_steps if isinstance(max_steps, int) and not isinstance(max_steps, bool) and max_steps > 0 else None
        filled = fill.warmup(args, steps)
    else:
        filled = given if isinstance(given, int) and not isinstance(given, bool) else None
    if filled is None or filled >= FIXED_WARMUP:
        return []
    why = _why(fill, filled, auto)
    fixes = [TrainerFix("deepspeed", ".".join(WARMUP_PATH), given, filled, FIXED_WARMUP, why)]
    if args is not None:
        old = args.get(WARMUP_ARG)
        fixes.append(TrainerFix("training args", WARMUP_ARG, old, old, FIXED_WARMUP, why))
    return fixes


def apply_fixes(tree: Mapping[str, Any], fixes: list[TrainerFix], file: str, *, undo: bool = False) -> dict[str, Any]:
    """A copy of ``tree`` (a DeepSpeed JSON or training args) with ``fixes`` of ``file`` written (``undo``: what their
    Trainer runs there instead, where it is known)."""
    import copy

    out = copy.deepcopy(dict(tree))
    for fix in fixes:
        if fix.file != file:
            continue
        value = fix.runs if undo else fix.new
        if undo and value is None:
            continue
        node = out
        path = fix.key.split(".")
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return out


def refusal_fix(fill: TrainerFill, fixes: list[TrainerFix]) -> str:
    """The one-line fix for the user's own files (``fixes`` not empty)."""
    args = any(f.file == "training args" for f in fixes)
    where = "warmup_steps: 1 in your training args" if args else "warmup_num_steps: 1 in your DeepSpeed file"
    return (
        f"set {where} (what transformers >= {'.'.join(map(str, WARMUP_CLAMPED_SINCE))} fills itself), or upgrade "
        f"transformers to >= {'.'.join(map(str, WARMUP_CLAMPED_SINCE))}; the exports write it for {fill.named}"
    )
