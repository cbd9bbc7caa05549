"""What a study definition from the API may carry in its baseline: the DeepSpeed sections that only say how a step is
computed, with sane numbers; nothing that acts on the training host.

A definition posted here is served by GET /best-config to every consumer of the study and run by every worker. From a
local file (`tuner search --baseline FILE`) the host-acting DeepSpeed sections (trials.contract.DS_HOST_KEYS:
profilers, monitors, the autotuner) are the user's own and are carried into the export, listed as not probed. From a
remote definer they are refused: a caller must not make /best-config hand every consumer a profiler writing to a path
of the caller's choosing, a monitor reporting to the caller's service, or an NVMe swap directory. So the DeepSpeed
section of a posted baseline (``baseline``, or ``training_args.deepspeed`` inline) holds only the allowlisted
sections below, no key naming a path or a file at any depth, and numbers in range; the training args hold no key that
writes files, pushes to a hub or reports to a service. Each refusal is one 422 line naming the key."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from typing import Any

from tuner.errors import BaselineError
from tuner.interop.ds_names import MAX_STEPS, as_number, check_types

# DeepSpeed top-level sections a definition from the API may hold: batch, precision, clipping, ZeRO, the optimizer and
# scheduler, activation checkpointing, communication dtypes. Everything else (flops_profiler, tensorboard, wandb,
# csv_monitor, comet, comms_logger, autotuning, monitor_config, aio, nebula, data_efficiency, elasticity, checkpoint,
# compression_training, pipeline ...) is refused.
DS_API_SECTIONS: frozenset[str] = frozenset(
    {
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
        "gradient_clipping",
        "steps_per_print",
        "wall_clock_breakdown",
        "prescale_gradients",
        "gradient_predivide_factor",
        "communication_data_type",
        "sparse_gradients",
        "fp16",
        "bf16",
        "bfloat16",
        "amp",
        "zero_optimization",
        "zero_allow_untested_optimizer",
        "zero_force_ds_cpu_optimizer",
        "optimizer",
        "scheduler",
        "activation_checkpointing",
        "data_types",
    }
)
# A key naming a place on the host, at any depth (offload_optimizer.nvme_path, ...): never from the API.
PATH_KEY = re.compile(r"(^|_)(path|dir|directory|file|folder|filename|url|uri)s?$", re.IGNORECASE)
# Training-args keys that write files, push to a hub or report to a service; any PATH_KEY is refused as well.
# (and so is every hub_* / push_to_hub* key and every key holding a token).
HF_HOST_KEYS: frozenset[str] = frozenset({"resume_from_checkpoint", "trackio_space_id", "project"})
# (dotted-path suffix, low, high, low inclusive, high inclusive): numbers outside are refused.
RANGES: tuple[tuple[str, float, float, bool, bool], ...] = (
    ("lr", 0.0, 1.0, False, True),
    ("learning_rate", 0.0, 1.0, False, True),
    ("warmup_min_lr", 0.0, 1.0, True, True),
    ("warmup_max_lr", 0.0, 1.0, False, True),
    ("cycle_min_lr", 0.0, 1.0, True, True),
    ("cycle_max_lr", 0.0, 1.0, False, True),
    ("weight_decay", 0.0, 1.0, True, True),
    ("eps", 0.0, 1.0, False, False),
    ("adam_epsilon", 0.0, 1.0, False, False),
    ("momentum", 0.0, 1.0, True, True),
    ("betas.0", 0.0, 1.0, True, False),
    ("betas.1", 0.0, 1.0, True, False),
    ("adam_beta1", 0.0, 1.0, True, False),
    ("adam_beta2", 0.0, 1.0, True, False),
    ("gradient_clipping", 0.0, 1e6, True, True),
    ("max_grad_norm", 0.0, 1e6, True, True),
    ("warmup_ratio", 0.0, 1.0, True, True),
    ("warmup_num_steps", 0.0, MAX_STEPS, True, True),
    ("total_num_steps", 0.0, MAX_STEPS, True, True),
    ("warmup_steps", 0.0, MAX_STEPS, True, True),
    ("cycle_first_step_size", 0.0, MAX_STEPS, True, True),
    ("cycle_second_step_size", 0.0, MAX_STEPS, True, True),
    ("decay_step_size", 0.0, MAX_STEPS, True, True),
    ("lr_range_test_step_size", 0.0, MAX_STEPS, True, True),
)
REPORT_NONE: tuple[Any, ...] = (None, "none", [], ["none"], ())


class RefusedBaseline(BaselineError):
    """A posted baseline holds content a remote definer may not set (HTTP 422)."""

    http_status = 422


def _walk(tree: Any, prefix: str) -> Iterator[tuple[str, str, Any]]:
    """(dotted path, key, value) of every entry of a nested config; list items are keyed by their index."""
    if isinstance(tree, Mapping):
        for key, value in tree.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            yield path, str(key), value
            yield from _walk(value, path)
    elif isinstance(tree, list):
        for i, value in enumerate(tree):
            path = f"{prefix}.{i}"
            yield path, str(i), value
            yield from _walk(value, path)


def _range(path: str) -> tuple[float, float, bool, bool] | None:
    for suffix, low, high, low_in, high_in in RANGES:
        if path == suffix or path.endswith("." + suffix):
            return low, high, low_in, high_in
    return None


def _check_numbers(where: str, tree: Mapping[str, Any]) -> None:
    for path, _key, given in _walk(tree, ""):
        value = as_number(given)  # a number, or a string that parses as one ("1000"): checked the same
        if value is None:
            continue
        if not math.isfinite(value):
            raise RefusedBaseline(f"{where}.{path}: {given!r} is not a finite number")
        bounds = _range(path)
        if bounds is None:
            continue
        low, high, low_in, high_in = bounds
        above = value > low if not low_in else value >= low
        below = value < high if not high_in else value <= high
        if not (above and below):
            span = f"{'[' if low_in else '('}{low:g}, {high:g}{']' if high_in else ')'}"
            raise RefusedBaseline(f"{where}.{path}: {given!r} is outside {span}; give a value in that range")


def _check_paths(where: str, tree: Any) -> None:
    for path, key, _value in _walk(tree, ""):
        if PATH_KEY.search(key):
            raise RefusedBaseline(
                f"{where}.{path}: a definition from the API may not name a place on the training host; "
                "run `tuner search --baseline FILE` on the worker host for a config that writes files"
            )


def check_deepspeed(ds: Mapping[str, Any], where: str = "baseline") -> None:
    """Refuses (RefusedBaseline, one line naming the key) a DeepSpeed section outside DS_API_SECTIONS, a path-like
    key at any depth, and numbers out of range."""
    for key in ds:
        if key not in DS_API_SECTIONS:
            raise RefusedBaseline(
                f"{where}.{key}: this DeepSpeed section is not accepted from the API (it acts on the training host "
                "or is not probed); accepted: batch, precision, zero_optimization, optimizer, scheduler, "
                "gradient_clipping, activation_checkpointing. Run `tuner search --baseline FILE` on the worker host "
                "to keep it"
            )
    _check_paths(where, ds)
    _check_numbers(where, ds)
    try:
        check_types(ds)  # the optimizer and scheduler types DeepSpeed knows (tuner.interop.ds_names)
    except BaselineError as err:
        raise RefusedBaseline(f"{where}.{err}") from None


def check_training_args(hf: Mapping[str, Any], where: str = "training_args") -> None:
    """Refuses training args that act on the host (HF_HOST_KEYS, path-like keys such as output_dir / logging_dir,
    report_to other than none, a deepspeed file path) and numbers out of range; an inline deepspeed section is held
    to check_deepspeed."""
    for key, value in hf.items():
        if key == "deepspeed":
            if isinstance(value, Mapping):
                check_deepspeed(value, f"{where}.deepspeed")
                continue
            if value is None:
                continue
            raise RefusedBaseline(
                f"{where}.deepspeed: the API takes the DeepSpeed config inline (an object, or `baseline`), not a "
                "file name on the worker host"
            )
        if key == "report_to":
            if value not in REPORT_NONE:
                raise RefusedBaseline(
                    f"{where}.report_to: {value!r} reports to a service from the training host; "
                    "give 'none' or leave it out"
                )
            continue
        if key in HF_HOST_KEYS or key.startswith(("hub_", "push_to_hub")) or PATH_KEY.search(key) or "token" in key:
            raise RefusedBaseline(
                f"{where}.{key}: a definition from the API may not set what writes files, pushes to a hub or holds "
                "a token on the training host; leave it out"
            )
        _check_paths(f"{where}.{key}", value)
    _check_numbers(where, {k: v for k, v in hf.items() if k != "deepspeed"})


def check_posted_baseline(ds: Mapping[str, Any] | None, hf: Mapping[str, Any] | None) -> None:
    if ds is not None:
        check_deepspeed(ds, "baseline")
    if hf is not None:
        check_training_args(hf, "training_args")
