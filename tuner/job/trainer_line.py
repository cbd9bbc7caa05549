"""The job line's words for what the user's training args make the probe run beyond the knobs (their optimizer,
label smoothing, compile, sampler ...), each with the key it comes from. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _optimizer(args: Mapping[str, Any]) -> str | None:
    if args.get("optim") is None and not args.get("adafactor"):
        return None
    name = "adafactor" if args.get("adafactor") and args.get("optim") is None else args.get("optim")
    extra = f" ({args['optim_args']})" if args.get("optim_args") else ""
    return f"optimizer {name}{extra} (args: optim)"


def _compile(args: Mapping[str, Any]) -> str | None:
    backend, mode = args.get("torch_compile_backend") or args.get("torchdynamo"), args.get("torch_compile_mode")
    if not (args.get("torch_compile") or backend or mode):
        return None
    said = ", ".join(str(x) for x in (backend or "inductor", mode) if x)
    return f"torch.compile ({said}; args: torch_compile)"


def _sampler(args: Mapping[str, Any]) -> str | None:
    strategy = args.get("train_sampling_strategy")
    if args.get("group_by_length") or strategy == "group_by_length":
        return "length-grouped batches (args: train_sampling_strategy)"
    if args.get("sortish_sampler"):
        return "sortish batches (args: sortish_sampler)"
    if strategy not in (None, "random"):
        return f"{strategy} sampler (args: train_sampling_strategy)"
    return None


def _flag(args: Mapping[str, Any], key: str, said: str) -> str | None:
    return f"{said} (args: {key})" if args.get(key) else None


def trainer_parts(args: Mapping[str, Any] | None) -> list[str]:
    """The job line's parts for ``args`` (the probe's TrainingArguments fields); none for the Trainer's defaults."""
    if not args:
        return []
    smoothing = args.get("label_smoothing_factor")
    kwargs = args.get("activation_checkpointing_kwargs") or args.get("gradient_checkpointing_kwargs")
    parts = [
        _optimizer(args),
        f"label smoothing {smoothing} (args: label_smoothing_factor)" if smoothing else None,
        _compile(args),
        _sampler(args),
        f"NEFTune alpha {args['neftune_noise_alpha']} (args)" if args.get("neftune_noise_alpha") else None,
        _flag(args, "use_liger_kernel", "Liger kernels"),
        f"checkpointing {kwargs} (args)" if kwargs else None,
        f"device cache emptied every {args['torch_empty_cache_steps']} steps (args: torch_empty_cache_steps)"
        if args.get("torch_empty_cache_steps")
        else None,
        _flag(args, "average_tokens_across_devices", "tokens averaged across ranks"),
        _flag(args, "full_determinism", "deterministic algorithms"),
        _flag(args, "tf32", "TF32 matmuls"),
        _flag(args, "use_cache", "model cache on in training"),
        f"eval logits of {args['eval_accumulation_steps']} batches kept on the device (args: eval_accumulation_steps)"
        if args.get("eval_accumulation_steps") and not args.get("prediction_loss_only")
        else None,
        _flag(args, "prediction_loss_only", "eval keeps no logits"),
    ]
    return [p for p in parts if p]
