"""The model and batches a memory trace runs (the plain trace, trials.estimate, and FSDP2's, trials.trace_fsdp): the
model as a probe builds it, the probe's worst-case batch, the generation cache's bytes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from trials.contract import LoraSpec, ModelSpec
from trials.contract_job import PaddingFree
from trials.data import worst_case_batch

if TYPE_CHECKING:
    from transformers import PreTrainedModel


@contextlib.contextmanager
def _adapters_stay_put() -> Iterator[None]:
    """peft moves each new adapter (and the module it wraps) to its base layer's device; in the trace everything is
    already there (CPU, fp32), and under FakeTensorMode a move swaps fake parameters, which torch refuses: so
    ``Module.to`` is a no-op while the adapters are injected."""
    saved = torch.nn.Module.to
    torch.nn.Module.to = lambda self, *args, **kwargs: self  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Module.to = saved  # type: ignore[method-assign]


def build(spec: ModelSpec, lora: LoraSpec | None = None, cast_to: torch.dtype | None = None) -> PreTrainedModel:
    """The model as a probe builds it: fp32, train mode, with the job's LoRA adapters (base frozen) if any;
    ``cast_to``: every floating parameter then cast to that dtype, buffers kept, as DeepSpeed's bf16/fp16 engine casts
    the module (deepspeed 0.19.8 ``_cast_module_mixed_precision``: params only; a rotary ``inv_freq`` stays fp32)."""
    from trials.models import instantiate, load_config

    model: Any = instantiate(load_config(spec), dtype=torch.float32)  # peft wraps it below
    if lora is not None:
        from trials.lora import apply_lora

        with _adapters_stay_put():
            model = apply_lora(model, lora)
    if cast_to is not None:
        for p in model.parameters():
            if p.is_floating_point() and p.dtype != cast_to:
                p.data = p.data.to(cast_to)
    model.train()
    return model


def worst_batch(
    model: torch.nn.Module,
    micro: int,
    length: int,
    label_length: int | None,
    padded: bool = False,
    padding_free: PaddingFree | None = None,
) -> dict[str, torch.Tensor]:
    """The probe's worst-case batch (trials.data): seq2seq labels at the job's label length; ``padded``: with the
    padding the user's collator adds (a job with data whose samples differ in length), as the probe builds it;
    ``padding_free``: flattened into one row as TRL's padding-free collator does (trials.data.flattened)."""
    vocab = int(getattr(model.config, "vocab_size", 32000))
    encdec = bool(getattr(model.config, "is_encoder_decoder", False))
    return worst_case_batch(
        micro,
        length,
        vocab,
        encoder_decoder=encdec,
        label_length=label_length,
        padded=padded,
        padding_free=padding_free,
    )


def cache_bytes(cache: Any) -> int:
    """The bytes of the generation cache's tensors (each storage once)."""
    seen: dict[int, int] = {}
    stack = [cache]
    while stack:
        obj = stack.pop()
        if isinstance(obj, torch.Tensor):
            storage = obj.untyped_storage()
            seen[id(storage)] = storage.nbytes()
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)
        elif obj is not None and hasattr(obj, "__dict__"):
            stack.extend(
                v for v in vars(obj).values() if isinstance(v, (torch.Tensor, list, tuple)) or hasattr(v, "layers")
            )
    return sum(seen.values())
