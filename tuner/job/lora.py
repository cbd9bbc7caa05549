"""A LoRA job: adapters on a base model, given by the user (--lora-r ... / ``tune(lora_r=...)``), held fixed.

LoRA is a job setting like precision, not a knob: it changes what trains, so the search never varies it; every probe
of the study trains the same adapters (trials.lora), the estimate counts grads and optimizer states for the adapters
only (tuner.memory.estimator), and no export writes it (the user's script builds the adapters; `tuner best
--changes` says it was held fixed). ``lora_spec`` is pure; ``check_lora`` builds the model on the meta device in a
subprocess (tuner/ never imports torch) before any probe, so a target module the model lacks is one line.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import get_args

from trials.contract import LoraBias, LoraSpec, ModelSpec
from tuner.errors import ConfigError

LORA_FLAGS = ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "lora_bias")
PEFT_HINT = "pip install peft (or pip install 'tuner[lora]')"
CHECK_TIMEOUT_S = 300.0


def target_list(value: str | Sequence[str] | None) -> tuple[str, ...]:
    """Target module names from "q_proj,v_proj" or a list; empty: peft's default for the model."""
    if value is None:
        return ()
    parts = value.split(",") if isinstance(value, str) else list(value)
    return tuple(p.strip() for p in parts if str(p).strip())


def lora_spec(
    r: int | None,
    alpha: int | None = None,
    dropout: float | None = None,
    target_modules: str | Sequence[str] | None = None,
    bias: str | None = None,
    *,
    option: Callable[[str], str] = str,
    peft_installed: bool | None = None,
) -> LoraSpec | None:
    """The LoRA spec of the flags (None without ``r``: a full fine-tune), or a ConfigError naming the option and
    the fix. ``option(name)`` spells a setting as the caller does (--lora-r, lora_r)."""
    given = {"lora_alpha": alpha, "lora_dropout": dropout, "lora_target_modules": target_modules, "lora_bias": bias}
    if r is None:
        stray = [name for name, value in given.items() if value is not None]
        if stray:
            raise ConfigError(f"{option(stray[0])} needs {option('lora_r')} (the adapters' rank, e.g. 16)")
        return None
    if r < 1:
        raise ConfigError(f"{option('lora_r')} {r} must be at least 1 (the adapters' rank, e.g. 16)")
    if alpha is not None and alpha < 1:
        raise ConfigError(f"{option('lora_alpha')} {alpha} must be at least 1 (e.g. 2 x {option('lora_r')})")
    if dropout is not None and not 0 <= dropout < 1:
        raise ConfigError(f"{option('lora_dropout')} {dropout:g} must be in [0, 1), e.g. 0.05")
    if bias is not None and bias not in get_args(LoraBias):
        raise ConfigError(f"{option('lora_bias')} {bias!r}: choose one of {', '.join(get_args(LoraBias))}")
    installed = peft_installed if peft_installed is not None else importlib.util.find_spec("peft") is not None
    if not installed:
        raise ConfigError(f"{option('lora_r')}: LoRA jobs need peft, which is not installed; {PEFT_HINT}")
    targets = target_list(target_modules)
    values: dict[str, object] = {"r": r, "target_modules": targets}
    values.update({k: v for k, v in (("alpha", alpha), ("dropout", dropout), ("bias", bias)) if v is not None})
    return LoraSpec.model_validate(values)


def check_lora(
    model: ModelSpec,
    spec: LoraSpec,
    option: Callable[[str], str] = str,
    timeout_s: float = CHECK_TIMEOUT_S,
    python: str | None = None,
) -> dict[str, int]:
    """Builds ``model`` with the adapters on the meta device (``python -m trials.lora``): its parameter counts
    ({"params", "trainable"}), or a ConfigError naming the fix (a target module it lacks, peft missing)."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    request = {"model": model.model_dump(mode="json"), "lora": spec.model_dump(mode="json")}
    with tempfile.TemporaryDirectory(prefix="tuner-lora-") as tmp:
        out = Path(tmp) / "counts.json"
        cmd = [python or sys.executable, "-m", "trials.lora", "--request", json.dumps(request), "--out", str(out)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, check=False)
        except subprocess.TimeoutExpired:
            raise ConfigError(f"building {model.source} with LoRA adapters took over {timeout_s:.0f} s") from None
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        last = lines[-1] if lines else f"exit {done.returncode}"
        if done.returncode == 4:
            raise ConfigError(f"{option('lora_r')}: LoRA jobs need peft, which is not installed; {PEFT_HINT}")
        if done.returncode == 3:
            fix = f"; name them in {option('lora_target_modules')}" if "target module" in last else ""
            raise ConfigError(f"{last}{fix}")
        if done.returncode != 0 or not out.exists():
            raise ConfigError(f"cannot build {model.source} with LoRA adapters: {last}")
        counts: dict[str, int] = json.loads(out.read_text())
        return counts
