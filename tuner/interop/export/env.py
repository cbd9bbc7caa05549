"""Knobs -> environment variables (allocator settings, and the tuned values for scripts that read the env)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from trials.contract import ALLOC_CONF_ENV, FsdpSettings
from tuner.errors import ConfigError
from tuner.interop.export.deepspeed import check_batch, validate_knobs
from tuner.interop.export.fsdp import fsdp_env, held
from tuner.interop.export.nodes import parallelism_env
from tuner.interop.fsdp_names import PRECISION_MIXED
from tuner.job.space import ALLOC_CONF_SYNTAX

_ALLOC_CONF = ALLOC_CONF_SYNTAX  # one syntax, checked when the space is read (tuner.job.space) and here


def to_env(
    knobs: Mapping[str, Any],
    *,
    world_size: int,
    gradient_accumulation_steps: int,
    baseline: Mapping[str, Any] | None = None,
    fsdp: FsdpSettings | Mapping[str, Any] | None = None,
    nnodes: int = 1,
) -> dict[str, str]:
    """Variable -> value. The allocator config goes to both names PyTorch reads; ACCELERATE_MIXED_PRECISION is what
    ``Accelerator()`` picks up by default; TUNER_* carry every tuned value for a training script to read. An FSDP2
    config adds the ACCELERATE_USE_FSDP / FSDP_* variables `accelerate launch` would set for its fsdp_config
    (``fsdp``: the user's held FSDP2 settings), so ``Accelerator()`` under torchrun builds the same FSDP2 plugin; its
    checkpointing is FSDP's own (FSDP_ACTIVATION_CHECKPOINTING), so TUNER_GRADIENT_CHECKPOINTING stays 0 (the Trainer
    refuses both) and the ZeRO values are left out."""
    k = validate_knobs(knobs)
    check_batch(world_size, gradient_accumulation_steps)
    env: dict[str, str] = {}
    if k.alloc_conf:
        if not _ALLOC_CONF.match(k.alloc_conf):
            raise ConfigError(
                f"alloc_conf {k.alloc_conf!r} is not PyTorch allocator syntax; write option:value pairs separated "
                "by commas, e.g. expandable_segments:True,max_split_size_mb:128"
            )
        for name in ALLOC_CONF_ENV:
            env[name] = k.alloc_conf
    env["ACCELERATE_MIXED_PRECISION"] = PRECISION_MIXED[k.precision]
    values: dict[str, Any] = {
        "MICRO_BATCH_SIZE": k.micro_batch_size,
        "GRADIENT_ACCUMULATION_STEPS": gradient_accumulation_steps,
        "WORLD_SIZE": world_size,
        "GLOBAL_BATCH": k.micro_batch_size * gradient_accumulation_steps * world_size,
        "MAX_LENGTH": k.max_length,
        "ENGINE": k.engine,
        "ZERO_STAGE": k.zero_stage,
        "OFFLOAD_OPTIMIZER": int(k.offload_optimizer),
        **({"OFFLOAD_PARAM": 1} if k.offload_param else {}),  # ZeRO-3's parameter offload, only where on
        "GRADIENT_CHECKPOINTING": int(k.gradient_checkpointing),
        "PRECISION": k.precision,
        "EVAL_BATCH_SIZE": k.eval_batch_size or k.micro_batch_size,
        "PREDICT_WITH_GENERATE": int(k.generate),
    }
    if k.engine == "fsdp2":
        for name in ("ZERO_STAGE", "OFFLOAD_OPTIMIZER"):
            values.pop(name)
        values.update(
            GRADIENT_CHECKPOINTING=0,
            RESHARD_AFTER_FORWARD=int(k.reshard_after_forward),
            OFFLOAD_PARAMS=int(k.offload_params),
        )
        env.update(fsdp_env(k, held(fsdp)))
        env.update(parallelism_env(k, world_size))  # HSDP: the mesh `accelerate launch` would ask for
    if nnodes > 1:
        values["NNODES"] = nnodes
    env.update({f"TUNER_{name}": str(value) for name, value in values.items()})
    return env


def render_env(env: Mapping[str, str]) -> str:
    """POSIX shell: `eval "$(tuner export --format env ...)"` or `source` the file."""
    return "".join(f"export {name}={shlex.quote(value)}\n" for name, value in env.items())
