"""LoRA adapters on a probe's model (peft), as the user's training script builds them.

``apply_lora`` wraps the model with ``peft.get_peft_model`` before the engine exists: the base weights are frozen,
only the adapters (and the biases ``bias`` names) train, so the engine's optimizer holds only their states.
``python -m trials.lora --request JSON --out FILE`` is the check before a search: it builds the model on the meta
device (no memory, no weights), applies the adapters and writes ``{"params", "trainable"}``; exit 3 with one line
when a target module is not in the model or the model cannot be loaded, exit 4 when peft is not installed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

from trials.contract import LoraSpec, ModelSpec
from trials.models import instantiate, is_encoder_decoder, load_config

EXIT_BAD_SPEC = 3
EXIT_NO_PEFT = 4


def missing_targets(model: torch.nn.Module, spec: LoraSpec) -> list[str]:
    """The spec's target modules that name no module of the model (peft matches a name or a dotted suffix)."""
    names = [name for name, _ in model.named_modules() if name]
    return [t for t in spec.target_modules if not any(n == t or n.endswith("." + t) for n in names)]


def linear_names(model: torch.nn.Module) -> list[str]:
    """The distinct last names of the model's linear layers (what a LoRA target usually is), for a message."""
    found = {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    return sorted(found)


def peft_config(spec: LoraSpec, model: torch.nn.Module) -> Any:
    """The ``peft.LoraConfig`` of ``spec`` for this model (a causal or a seq2seq LM task)."""
    from peft import LoraConfig, TaskType

    task = TaskType.SEQ_2_SEQ_LM if is_encoder_decoder(model) else TaskType.CAUSAL_LM
    return LoraConfig(
        task_type=task,
        r=spec.r,
        lora_alpha=spec.alpha,
        lora_dropout=spec.dropout,
        target_modules=list(spec.target_modules) or None,
        bias=spec.bias,
    )


def apply_lora(model: torch.nn.Module, spec: LoraSpec) -> torch.nn.Module:
    """``model`` with LoRA adapters (a peft PeftModel: base frozen). ValueError naming the model's linear layers
    when a target module is not in it."""
    from peft import get_peft_model

    missing = missing_targets(model, spec)
    if missing:
        raise ValueError(
            f"LoRA target module{'s' if len(missing) > 1 else ''} {', '.join(missing)} not in the model; its linear "
            f"layers are {', '.join(linear_names(model))}"
        )
    return get_peft_model(model, peft_config(spec, model))


def trainable_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def check(model: ModelSpec, spec: LoraSpec) -> dict[str, int]:
    """The parameter counts of ``model`` with the adapters, built on the meta device (nothing allocated)."""
    config = load_config(model)
    with torch.device("meta"):
        built = instantiate(config)
        wrapped = apply_lora(built, spec)
    return {"params": sum(p.numel() for p in wrapped.parameters()), "trainable": trainable_count(wrapped)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trials.lora", description=__doc__.splitlines()[0])
    ap.add_argument("--request", required=True, help='JSON: {"model": ModelSpec, "lora": LoraSpec}')
    ap.add_argument("--out", required=True, help="file to write the counts to")
    args = ap.parse_args(argv)
    request = json.loads(args.request)
    try:
        import peft  # noqa: F401
    except ImportError:
        print("LoRA jobs need peft: pip install peft", file=sys.stderr)
        return EXIT_NO_PEFT
    try:
        counts = check(ModelSpec.model_validate(request["model"]), LoraSpec.model_validate(request["lora"]))
    except (ValueError, OSError) as exc:
        print(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__, file=sys.stderr)
        return EXIT_BAD_SPEC
    Path(args.out).write_text(json.dumps(counts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
