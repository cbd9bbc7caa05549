"""The user's TrainingArguments inside a probe, and what their Trainer builds from them, borrowed from transformers.

``their_args`` builds the probe's TrainingArguments (Seq2SeqTrainingArguments for a Seq2Seq file) with the class of
the transformers installed here, from the user's own fields (``JobSettings.trainer_args``: every field of their file
but those the probe sets itself) and the config's knobs (micro batch, eval batch, precision, checkpointing): their
release's checks run, and a file it refuses is refused with its reason (``ArgsRefused``). The pieces of the step then
come from the Trainer's own code, not a copy: ``build_optimizer`` is ``Trainer.create_optimizer`` (its resolver
``get_optimizer_cls_and_kwargs``, its weight-decay groups); ``loss_function`` is its LabelSmoother; ``prepare_model``
sets ``use_cache`` as the Trainer does, applies Liger's kernels and NEFTune's hook; ``compile_model`` compiles as
accelerate does for the Trainer (torch.compile with the args' backend and mode).

``python -m trials.trainer_args FILE`` checks a job's arguments before any probe launches (stdin: {"trainer_args",
"seq2seq", "precision"}; FILE gets {"refusal": str | null, "transformers": version}).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, cast

import torch

from trials.outcome import ConfigRefused

#: TrainingArguments fields that need a CUDA device where TrainingArguments checks them (tf32 raises without one):
#: dropped on a host without GPUs, where the emulated device runs CPU kernels
CUDA_ONLY = ("tf32",)


class ArgsRefused(ConfigRefused):
    """Their release's TrainingArguments refuse the file (what their Trainer would raise at start)."""


def their_args(
    given: Mapping[str, Any] | None,
    *,
    seq2seq: bool,
    micro_batch_size: int,
    eval_batch_size: int | None,
    precision: str,
    checkpointing: bool,
    cuda: bool,
) -> Any | None:
    """The probe's TrainingArguments from the user's fields and the config's knobs; None for a job without training
    args (a preset, flags only). An ArgsRefused with their release's reason when its class refuses them."""
    if given is None:
        return None
    from transformers import Seq2SeqTrainingArguments, TrainingArguments

    cls = Seq2SeqTrainingArguments if seq2seq else TrainingArguments
    fields = dict(given)
    if not cuda:
        for name in CUDA_ONLY:
            fields.pop(name, None)
    names = {f.name for f in dataclasses.fields(cls)}
    # transformers >= 5.23 names it activation_checkpointing (the old name warns)
    checkpointing_name = "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"
    fields.update(
        output_dir=tempfile.mkdtemp(prefix="tuner-args-"),
        report_to="none",
        per_device_train_batch_size=micro_batch_size,
        per_device_eval_batch_size=eval_batch_size or micro_batch_size,
        bf16=precision == "bf16",
        fp16=precision == "fp16",
        use_cpu=not cuda,
    )
    fields[checkpointing_name] = checkpointing
    try:
        return cls(**fields)
    except (ValueError, TypeError, ImportError) as exc:
        text = " ".join(str(exc).split())
        raise ArgsRefused(f"their TrainingArguments refuse these arguments: {type(exc).__name__}: {text}") from None


class _TrainerShim:
    """What ``Trainer.create_optimizer`` reads of a Trainer, and nothing else."""

    def __init__(self, model: torch.nn.Module, args: Any) -> None:
        from transformers import Trainer

        self.model = self.model_wrapped = model
        self.args = args
        self.optimizer: torch.optim.Optimizer | None = None
        self.optimizer_cls_and_kwargs = None
        self._decay = Trainer.get_decay_parameter_names
        self.get_optimizer_cls_and_kwargs = Trainer.get_optimizer_cls_and_kwargs

    def get_decay_parameter_names(self, model: torch.nn.Module) -> list[str]:
        return list(self._decay(cast(Any, self), model))


def build_optimizer(model: torch.nn.Module, args: Any | None, lr: float, cuda: bool) -> torch.optim.Optimizer:
    """The optimizer their Trainer builds over ``model``'s trainable parameters: ``Trainer.create_optimizer`` with
    their arguments; without training args, the Trainer's default (trials.optim.client_optimizer)."""
    if args is None:
        from trials.optim import client_optimizer

        return client_optimizer([p for p in model.parameters() if p.requires_grad], lr, cuda)
    from transformers import Trainer

    shim: Any = _TrainerShim(model, args)
    try:
        optimizer: torch.optim.Optimizer = Trainer.create_optimizer(shim)
    except ImportError as exc:  # an optimizer whose package this host lacks (bitsandbytes' 8-bit ones ...)
        raise ConfigRefused(
            f"optim {getattr(getattr(args, 'optim', None), 'value', '?')}: {' '.join(str(exc).split())}; install it "
            "beside tuner on the host "
            "that runs the search"
        ) from None
    return optimizer


def optimizer_over(
    params: Iterable[torch.Tensor], args: Any | None, model: torch.nn.Module | None, lr: float
) -> torch.optim.Optimizer:
    """Their optimizer's class and keywords (the Trainer's resolver) over other tensors than the model's own (the
    memory trace's fp32 masters and flat partitions, as DeepSpeed hands them to a client optimizer)."""
    if args is None:
        return torch.optim.AdamW(list(params), lr=lr, foreach=True)
    from transformers import Trainer

    cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args, cast(Any, model))
    kwargs = {k: v for k, v in dict(kwargs).items() if k not in ("params", "model", "optimizer_dict")}
    optimizer: torch.optim.Optimizer = cls(list(params), **kwargs)
    return optimizer


def their_forward(
    args: Any | None, causal: bool
) -> Callable[[torch.nn.Module, dict[str, torch.Tensor]], tuple[Any, Any]]:
    """How their Trainer's ``compute_loss`` runs a batch, as (loss, outputs): the model's own loss (labels in the
    batch), or with a ``label_smoothing_factor`` the Trainer's LabelSmoother over the logits (labels popped; shifted
    for a causal LM). Its training step and its eval's ``prediction_step`` both run it."""
    factor = float(getattr(args, "label_smoothing_factor", 0.0) or 0.0)
    if factor == 0:

        def plain(module: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[Any, Any]:
            outputs = module(**batch)
            return outputs.loss, outputs

        return plain
    from transformers.trainer_pt_utils import LabelSmoother

    smoother = LabelSmoother(epsilon=factor)

    def smoothed(module: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[Any, Any]:
        inputs = dict(batch)
        labels = inputs.pop("labels")
        outputs = module(**inputs)
        return smoother(outputs, labels, shift_labels=causal), outputs

    return smoothed


def loss_function(args: Any | None, causal: bool) -> Callable[[torch.nn.Module, dict[str, torch.Tensor]], Any]:
    """A micro-step's loss as their Trainer computes it (``their_forward``'s first half)."""
    forward = their_forward(args, causal)
    return lambda module, batch: forward(module, batch)[0]


def prepare_model(model: torch.nn.Module, args: Any | None) -> Callable[[], None]:
    """What their Trainer does to the model before its engine: ``use_cache`` set from their arguments, Liger's
    kernels applied, NEFTune's hook on the input embeddings. Returns what undoes the hook (nothing else to undo)."""
    if args is None:
        return lambda: None
    config = getattr(model, "config", None)
    if config is not None and hasattr(args, "use_cache"):
        config.use_cache = args.use_cache
    if getattr(args, "use_liger_kernel", False):
        _liger(model, args)
    alpha = getattr(args, "neftune_noise_alpha", None)
    if alpha is None:
        return lambda: None
    try:  # transformers >= 5.x: the Trainer's own activation
        from transformers.integrations.neftune import activate_neftune

        handle = activate_neftune(model, alpha)
    except ImportError:  # 4.x: the Trainer registers trainer_utils' hook on the input embeddings
        from transformers.trainer_utils import neftune_post_forward_hook  # type: ignore[attr-defined]

        embeddings = model.get_input_embeddings()  # type: ignore[operator]
        embeddings.neftune_noise_alpha = alpha
        handle = embeddings.register_forward_hook(neftune_post_forward_hook)
    undo: Callable[[], None] = handle.remove
    return undo


def _liger(model: torch.nn.Module, args: Any) -> None:
    """Liger's kernels, as their Trainer applies them (``_apply_liger_kernel_to_instance``); refused where
    liger-kernel is not installed (it needs Triton and a GPU)."""
    config = getattr(args, "liger_kernel_config", None) or {}
    _liger_module()._apply_liger_kernel_to_instance(model=model, **config)


def _liger_module() -> Any:
    """liger_kernel.transformers, or the ConfigRefused saying it is missing here."""
    try:
        import liger_kernel.transformers as liger
    except ImportError:
        raise ConfigRefused(
            "use_liger_kernel: liger-kernel is not installed on this host (it needs Triton and a GPU); install it "
            "beside tuner on your GPU host, or search with use_liger_kernel false"
        ) from None
    return liger


def compile_options(args: Any | None, dynamo: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """torch.compile's keywords as their Trainer compiles the model (accelerate's dynamo plugin from
    torch_compile / torch_compile_backend / torch_compile_mode), else as their accelerate config's dynamo_config asks
    (``dynamo``: JobSettings.compile); None when they do not compile."""
    if args is None or not getattr(args, "torch_compile", False):
        return dict(dynamo) if dynamo else None
    options: dict[str, Any] = {"backend": getattr(args, "torch_compile_backend", None) or "inductor"}
    mode = getattr(args, "torch_compile_mode", None)
    if mode:
        options["mode"] = mode
    return options


def compiled(
    module: torch.nn.Module, args: Any | None, parts: dict[str, float], dynamo: dict[str, Any] | None = None
) -> torch.nn.Module:
    """``module`` compiled as their Trainer compiles it (torch_compile, its backend and mode; or their accelerate
    config's ``dynamo``), else itself; the compile itself happens at the first step: its time goes to the probe's
    memory window, not the timed one."""
    options = compile_options(args, dynamo)
    if options is None:
        return module
    began = time.monotonic()
    out = torch.compile(module, **options)
    parts["compile"] = time.monotonic() - began
    return out  # type: ignore[return-value]


def ddp_kwargs(knobs: Any, device: torch.device, args: Any | None) -> dict[str, Any]:
    """DistributedDataParallel's keywords as their Trainer passes them (accelerate's DDP kwargs from
    ddp_find_unused_parameters, ddp_bucket_cap_mb, ddp_broadcast_buffers, ddp_static_graph); the bucket from the
    reduce_bucket_size knob when their arguments name none."""
    kwargs: dict[str, Any] = {
        "device_ids": [device.index] if device.type == "cuda" else None,
        "bucket_cap_mb": knobs.reduce_bucket_size * 4 / 2**20 if knobs.reduce_bucket_size else 25.0,
    }
    if args is None:
        return kwargs
    named = {
        "find_unused_parameters": "ddp_find_unused_parameters",
        "bucket_cap_mb": "ddp_bucket_cap_mb",
        "broadcast_buffers": "ddp_broadcast_buffers",
        "static_graph": "ddp_static_graph",
    }
    for key, field in named.items():
        value = getattr(args, field, None)
        if value is not None:
            kwargs[key] = value
    return kwargs


def checkpointing_kwargs(args: Any | None) -> dict[str, Any] | None:
    """gradient_checkpointing_enable's keywords from their arguments (5.25's activation_checkpointing_kwargs first)."""
    for name in ("activation_checkpointing_kwargs", "gradient_checkpointing_kwargs"):
        value = getattr(args, name, None) if args is not None else None
        if value:
            return dict(value)
    return None


def empty_cache_steps(args: Any | None) -> int | None:
    """Every how many optimizer steps their Trainer empties the device cache (torch_empty_cache_steps)."""
    value = getattr(args, "torch_empty_cache_steps", None) if args is not None else None
    return int(value) if value else None


def averages_tokens(args: Any | None, world_size: int) -> bool:
    """Whether their Trainer all-reduces each step's token count over the ranks (average_tokens_across_devices)."""
    return bool(getattr(args, "average_tokens_across_devices", False)) and world_size > 1


def deterministic(args: Any | None) -> bool:
    return bool(getattr(args, "full_determinism", False)) if args is not None else False


def resolver_checked(given: Mapping[str, Any], seq2seq: bool) -> None:
    """Their optimizer resolvable on this host (its package installed) and Liger's kernels importable where they ask
    for them: a ConfigRefused naming it, as a probe refuses it. Optimizers that need the model to resolve are left to
    the probe."""
    if given.get("use_liger_kernel"):
        _liger_module()
    if not given.get("optim"):
        return
    args: Any = their_args(
        given,
        seq2seq=seq2seq,
        micro_batch_size=1,
        eval_batch_size=None,
        precision="fp32",
        checkpointing=False,
        cuda=False,
    )
    from transformers import Trainer

    try:
        Trainer.get_optimizer_cls_and_kwargs(args)
    except ImportError as exc:
        raise ConfigRefused(
            f"optim {getattr(args.optim, 'value', args.optim)}: {' '.join(str(exc).split())}; install it beside "
            "tuner on the host that runs the search"
        ) from None
    except (ValueError, TypeError):  # needs the model (GaLore's target modules ...): the probe resolves it
        return


def main(argv: list[str] | None = None) -> int:
    """Checks a job's arguments as their release's TrainingArguments check them (before any probe launches)."""
    out = Path((argv if argv is not None else sys.argv[1:])[0])
    request = json.loads(sys.stdin.read())
    refusal = None
    try:
        their_args(
            request.get("trainer_args") or {},
            seq2seq=bool(request.get("seq2seq")),
            micro_batch_size=1,
            eval_batch_size=None,
            precision=str(request.get("precision") or "fp32"),
            checkpointing=False,
            cuda=torch.cuda.is_available(),
        )
        resolver_checked(request.get("trainer_args") or {}, bool(request.get("seq2seq")))
    except ConfigRefused as exc:
        refusal = str(exc)
    import transformers

    out.write_text(json.dumps({"refusal": refusal, "transformers": transformers.__version__}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
