"""The optimizer and scheduler types DeepSpeed accepts in its JSON, read from the installed deepspeed's and torch's own
source (their constants and ``__all__``, parsed, not imported: importing deepspeed takes seconds and logs), else the
documented lists below. DeepSpeed takes an optimizer type that is one of its own (any case) or a ``torch.optim``
class, and a scheduler that is one of ``deepspeed.runtime.lr_schedules``' or a ``torch.optim.lr_scheduler`` class;
anything else fails at ``deepspeed.initialize`` on the training host. Pure: no torch import."""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from tuner.errors import BaselineError

# deepspeed 0.19's DEEPSPEED_OPTIMIZERS and VALID_LR_SCHEDULES, torch 2.x's torch.optim and lr_scheduler classes:
# used when the installed packages' sources cannot be read
DOCUMENTED_DS_OPTIMIZERS = ("adagrad", "adam", "adamw", "lamb", "muadam", "muadamw", "musgd", "lion", "muon")
DOCUMENTED_DS_SCHEDULERS = ("LRRangeTest", "OneCycle", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR")
DOCUMENTED_TORCH_OPTIMIZERS = (
    *("Adafactor", "Adadelta", "Adagrad", "Adam", "Adamax", "AdamW", "ASGD", "LBFGS", "Muon", "NAdam", "RAdam"),
    *("RMSprop", "Rprop", "SGD", "SparseAdam"),
)
DOCUMENTED_TORCH_SCHEDULERS = (
    *("LambdaLR", "MultiplicativeLR", "StepLR", "MultiStepLR", "ConstantLR", "LinearLR", "ExponentialLR"),
    *("SequentialLR", "CosineAnnealingLR", "ChainedScheduler", "ReduceLROnPlateau", "CyclicLR"),
    *("CosineAnnealingWarmRestarts", "OneCycleLR", "PolynomialLR", "LRScheduler"),
)


def _source(package: str, relative: str) -> ast.Module | None:
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    try:
        return ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None


def _names(tree: ast.Module | None, list_name: str) -> tuple[str, ...]:
    """The strings of module-level list ``list_name`` (literals, or names of module-level string constants)."""
    if tree is None:
        return ()
    consts: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name, value = node.targets[0].id, node.value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                consts[name] = value.value
            elif name == list_name and isinstance(value, (ast.List, ast.Tuple)):
                items = [
                    e.value if isinstance(e, ast.Constant) else consts.get(getattr(e, "id", "")) for e in value.elts
                ]
                return tuple(i for i in items if isinstance(i, str))
    return ()


@cache
def known_optimizers() -> tuple[frozenset[str], frozenset[str]]:
    """(DeepSpeed's own optimizer names, lower case; torch.optim's class names)."""
    ds = _names(_source("deepspeed", "runtime/config.py"), "DEEPSPEED_OPTIMIZERS") or DOCUMENTED_DS_OPTIMIZERS
    torch = _names(_source("torch", "optim/__init__.py"), "__all__") or DOCUMENTED_TORCH_OPTIMIZERS
    return frozenset(ds), frozenset(n for n in torch if n[:1].isupper() and n != "Optimizer")


@cache
def known_schedulers() -> frozenset[str]:
    ds = _names(_source("deepspeed", "runtime/lr_schedules.py"), "VALID_LR_SCHEDULES") or DOCUMENTED_DS_SCHEDULERS
    torch = _names(_source("torch", "optim/lr_scheduler.py"), "__all__") or DOCUMENTED_TORCH_SCHEDULERS
    return frozenset(ds) | frozenset(torch)


def check_types(ds: Mapping[str, Any]) -> None:
    """A BaselineError naming the field when the optimizer or scheduler type is none DeepSpeed accepts."""
    own, torch = known_optimizers()
    for block, known, fold in (("optimizer", own | torch, True), ("scheduler", known_schedulers(), False)):
        section = ds.get(block)
        if section is None:
            continue
        if not isinstance(section, Mapping) or section.get("type") is None:  # no type: the script's own optimizer
            continue
        kind = section["type"]
        if not isinstance(kind, str) or not (kind in known or (fold and kind.lower() in own)):
            shown = repr(kind)[:60]
            raise BaselineError(
                f"{block}.type {shown} is not {'an' if block == 'optimizer' else 'a'} {block} DeepSpeed knows; "
                f"give one of {', '.join(sorted(known))}"
            )


MAX_STEPS = 10**9  # a scheduler's step count past this never ends in a training run (1e308: a typo or an attack)


def as_number(value: Any) -> float | None:
    """``value`` as a number when it is one or a string that parses as one ("1000", "1e-4"); else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


def check_params(ds: Mapping[str, Any]) -> None:
    """The optimizer's and scheduler's params as torch takes them: numbers, not numeric strings ("lr": "1000" fails
    in torch.optim), finite, and a scheduler's step counts at most MAX_STEPS."""
    for block in ("optimizer", "scheduler"):
        section = ds.get(block)
        params = section.get("params") if isinstance(section, Mapping) else None
        if not isinstance(params, Mapping):
            continue
        for key, value in params.items():
            number = as_number(value)
            if number is None:
                continue
            where = f"{block}.params.{key}"
            if isinstance(value, str):
                raise BaselineError(
                    f"{where} is the string {value[:40]!r}; give it as a number (torch refuses a string)"
                )
            if number != number or number in (float("inf"), float("-inf")):
                raise BaselineError(f"{where}: {value!r} is not a finite number")
            if str(key).endswith(("steps", "step_size")) and not 0 <= number <= MAX_STEPS:
                raise BaselineError(
                    f"{where}: {value!r} is outside [0, {MAX_STEPS:,}] steps; give your real step count"
                )
