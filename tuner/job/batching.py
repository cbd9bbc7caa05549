"""Gradient-accumulation arithmetic at a fixed global batch: global = micro x accumulation x world. Pure."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from trials.contract import Knobs
from tuner.errors import ConfigError

GLOBAL_BATCH_FLAGS = ("--global-batch", "--micro-batch-size", "--world-size")  # the CLI's spelling
GLOBAL_BATCH_KEYWORDS = ("global_batch", "micro_batch_size", "world_size")  # tune()'s and estimate()'s


def accumulation_steps(global_batch: int, micro_batch_size: int, world_size: int) -> int | None:
    """The accumulation that reaches ``global_batch`` exactly, or None when no whole number does."""
    if global_batch < 1 or micro_batch_size < 1 or world_size < 1:
        return None
    per_step = micro_batch_size * world_size
    if global_batch % per_step:
        return None
    return global_batch // per_step


def reachable_micro_batches(choices: Iterable[int], global_batch: int, world_size: int) -> list[int]:
    """The micro batch sizes among ``choices`` that reach the global batch exactly (never silently shrunk)."""
    return [m for m in choices if accumulation_steps(global_batch, m, world_size) is not None]


def require_reachable(choices: Iterable[int], global_batch: int, world_size: int) -> list[int]:
    choices = list(choices)
    ok = reachable_micro_batches(choices, global_batch, world_size)
    if not ok:
        raise ConfigError(
            f"global batch {global_batch} cannot be reached by any micro_batch_size in {choices} x world size "
            f"{world_size}; pick a global batch that is a multiple of micro_batch_size x world size"
        )
    return ok


def default_global_batch(choices: Iterable[int], world_size: int) -> int:
    """The smallest global batch every micro batch choice reaches: lcm(choices) x world size."""
    from math import lcm

    values = list(choices)
    return lcm(*values) * world_size if values else world_size


def validated_knobs(
    values: Any, global_batch: int | None, world_size: int, spelling: tuple[str, str, str] = GLOBAL_BATCH_FLAGS
) -> Knobs:
    """``values`` (Knobs or a mapping) as Knobs, whose micro batch reaches ``global_batch`` exactly: a value Knobs
    refuses, or a global batch no whole accumulation reaches, is one ConfigError line. ``spelling`` names the global
    batch, the micro batch and the world size as the caller's user typed them (CLI flags or tune()'s keywords)."""
    from pydantic import ValidationError

    try:
        knobs = values if isinstance(values, Knobs) else Knobs.model_validate(dict(values))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first.get("loc", ())) or "knobs"
        raise ConfigError(f"{where}: {first['msg']}") from None
    if global_batch is not None and accumulation_steps(global_batch, knobs.micro_batch_size, world_size) is None:
        batch_name, micro_name, world_name = spelling
        raise ConfigError(
            f"{batch_name} {global_batch} is not a whole number of micro batches: give a multiple of "
            f"{micro_name} x {world_name} = {knobs.micro_batch_size * world_size}"
        )
    return knobs


def held_global_batch(
    given: int | None, files: int | None, files_how: str, change: bool, option: Callable[[str], str] = str
) -> int | None:
    """The global batch of a job: their files' (``files``: micro x accumulation x world, ``files_how`` in words),
    unless ``given`` (the option) differs and ``change`` asks for it as a change to their job. A different one
    without ``change``: one line naming both. None: neither gives one."""
    if change and given is None:
        raise ConfigError(f"{option('change_global_batch')} goes with {option('global_batch')} N: the batch to search")
    if given is None or files is None or given == files:
        return given or files
    if not change:
        raise ConfigError(
            f"{option('global_batch')} {given} differs from your files' global batch {files} ({files_how}): drop "
            f"{option('global_batch')} to keep yours, or add {option('change_global_batch')} to use {given} as a "
            "change to your job"
        )
    return given
