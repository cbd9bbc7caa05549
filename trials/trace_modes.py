"""How the memory trace runs as the engine and the device run (trials.estimate):

- ``Mode`` / ``MasterStep``: the engine's precision (DeepSpeed's half module with fp32 masters in its optimizer, or
  the plain torch engine's autocast over fp32 weights);
- ``masks_decided_as_on_real_tensors``: transformers' choice to pass no attention mask for an all-ones padding mask,
  which it refuses to make on a fake tensor's values; ``packing_decided_as_on_real_tensors`` its packed-sequence
  detection in a padding-free batch's position_ids;
- ``cuda_kernels``: the kernels a CUDA device runs where their memory differs from the CPU's (``tuner estimate
  --kernels cuda``): fused dropout, and attention with a position bias on the math path.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch

_HALF = {"bf16": torch.bfloat16, "fp16": torch.float16}


class Mode:
    """How the traced engine runs the job's precision: ``cast_module`` (DeepSpeed bf16/fp16: the module itself in half
    precision, no autocast; fp32 master weights and Adam state in its optimizer) or fp32 weights under autocast (the
    plain torch engine, and the Trainer's eval without DeepSpeed); fp32 alike in both."""

    def __init__(self, precision: str, cast_module: bool) -> None:
        self.dtype = _HALF.get(precision)
        self.cast_module = cast_module and self.dtype is not None

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.dtype is None or self.cast_module:
            return contextlib.nullcontext()
        return torch.autocast("cpu", dtype=self.dtype)


class MasterStep:
    """The optimizer as the engine holds it. Plain torch: AdamW over the trained params. A cast module (DeepSpeed
    bf16/fp16): AdamW over fp32 master copies with fp32 grads (BF16_Optimizer's / ZeRO's fp32 partition and grads),
    the half grads copied in before each step, so the step's temporaries are fp32-sized as the engine's are."""

    def __init__(
        self,
        trainable: list[torch.nn.Parameter],
        cast_module: bool,
        make: Callable[[list[torch.Tensor], bool], torch.optim.Optimizer] | None = None,
    ) -> None:
        """``make(params, masters)``: the job's optimizer over ``params`` (trials.trace_trainer.optimizer_factory:
        their Trainer's); None: AdamW (foreach), the Trainer's default as traced before training args were read."""
        self.trainable = trainable
        self.masters: list[torch.Tensor] = []
        if cast_module:
            self.masters = [torch.zeros(p.shape, dtype=torch.float32, requires_grad=True) for p in trainable]
            for m in self.masters:
                m.grad = torch.zeros_like(m)
        params: list[torch.Tensor] = list(self.masters or trainable)
        self.opt = make(params, bool(self.masters)) if make else torch.optim.AdamW(params, lr=1e-4, foreach=True)

    def step(self) -> None:
        for m, p in zip(self.masters, self.trainable, strict=False):  # no masters: plain torch steps the params
            if p.grad is not None and m.grad is not None:
                m.grad.copy_(p.grad)
        self.opt.step()

    def zero_grad(self, set_to_none: bool) -> None:
        for p in self.trainable:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()


@contextlib.contextmanager
def masks_decided_as_on_real_tensors(apply: bool) -> Iterator[None]:
    """transformers decides whether a model needs an explicit attention mask (``masking_utils.
    _ignore_causal_mask_sdpa`` for a causal LM, ``_ignore_bidirectional_mask_sdpa`` for an encoder, T5's too): when
    the padding mask is all ones (and a causal mask square, or one query row), it passes none and SDPA runs without
    one (``is_causal`` for a causal LM), as the real probe's all-ones batch does. It will not read a fake tensor's
    values (``is_tracing`` counts a FakeTensor as tracing, for torch.export), so under FakeTensorMode every layer got a
    [batch, 1, len, len] mask that SDPA's CPU kernel converts to fp32 (2 x 4 bytes x len^2 per sample on a 2-layer
    Llama): memory the probe never allocates (the trace read 10.8% high, up to 35%, on a tiny-llama table; T5's eval
    forward in bf16 11% high on the tiny T5). An unpadded trace's batches hold an all-ones mask
    (``trials.data.worst_case_batch``; a decode extends it with ones), so while tracing the decision is made as on
    those real values; a sliding-window (local) mask still goes to transformers' own rule. ``apply`` False (real
    tensors, or a padded trace) keeps transformers' rule: a padded batch's mask is built, as the real run builds
    it."""
    try:
        from transformers import masking_utils
    except ImportError:  # transformers < 4.53: no masking_utils (its mask helpers test jit / fx / dynamo only)
        yield
        return
    saved: dict[str, Any] = {}
    if apply:
        for name, unpadded in (
            ("_ignore_causal_mask_sdpa", _unpadded_causal),
            ("_ignore_bidirectional_mask_sdpa", _unpadded_bidirectional),
        ):
            original = getattr(masking_utils, name, None)
            if original is not None:
                saved[name] = original
                setattr(masking_utils, name, unpadded(original))
    try:
        yield
    finally:
        for name, original in saved.items():
            setattr(masking_utils, name, original)


@contextlib.contextmanager
def packing_decided_as_on_real_tensors(apply: bool, padding_free: str | None, length: int) -> Iterator[None]:
    """transformers reads packed sequences from a padding-free batch's ``position_ids`` (``masking_utils.
    find_packed_sequence_indices``: a restart at 0 inside a row) and then builds the row's block-diagonal mask; on a
    fake tensor it cannot read them and always builds it. A traced padding-free batch (trials.data.flattened) holds
    several sequences, and so the mask, but for a single ``length`` row of "rows" (wrapped rows, one a micro batch):
    decided as on those real values, no mask. ``apply`` False (real tensors, or not padding-free): transformers'
    own rule."""
    try:
        from transformers import masking_utils
    except ImportError:
        yield
        return
    original = getattr(masking_utils, "find_packed_sequence_indices", None)
    if not apply or padding_free != "rows" or original is None:
        yield
        return

    def decide(position_ids: torch.Tensor) -> torch.Tensor | None:
        return None if position_ids.shape[-1] <= length else original(position_ids)

    masking_utils.find_packed_sequence_indices = decide
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = original


def _unpadded_causal(original: Any) -> Any:
    """``_ignore_causal_mask_sdpa`` as an all-ones padding mask decides it on real tensors."""

    def decide(
        padding_mask: torch.Tensor | None,
        q_length: int,
        kv_length: int,
        q_offset: int,
        kv_offset: int,
        local_attention_size: int | None = None,
    ) -> bool:
        local = local_attention_size
        if (local is None or kv_length < local) and (q_length == 1 or kv_length == q_length):
            return True
        return bool(original(padding_mask, q_length, kv_length, q_offset, kv_offset, local))

    return decide


def _unpadded_bidirectional(original: Any) -> Any:
    """``_ignore_bidirectional_mask_sdpa`` (an encoder's, T5's) as an all-ones padding mask decides it on real
    tensors."""

    def decide(padding_mask: torch.Tensor | None, kv_length: int, local_attention_size: int | None = None) -> bool:
        if local_attention_size is None or kv_length < local_attention_size:
            return True
        return bool(original(padding_mask, kv_length, local_attention_size))

    return decide


_SDPA_MATH_UPCAST = (torch.bfloat16, torch.float16)


@contextlib.contextmanager
def cuda_kernels(apply: bool) -> Iterator[None]:
    """The kernels a CUDA device runs where their memory differs from the CPU's, for a trace of a job that trains on
    a GPU (``kernels="cuda"``). A fake-tensor trace runs CPU kernels; two of them keep other tensors than CUDA's:

    - dropout: ATen fuses it only for a CUDA input (``is_fused_kernel_acceptable``): ``native_dropout`` keeps a bool
      mask (1 byte an element), where the CPU keeps a noise tensor in the input's dtype (4 bytes in fp32 or
      upcast attention, 2 in bf16); every nn.Dropout of a T5 (rate 0.1) and the attention probabilities' dropout;
    - attention with a float bias (T5's position bias, added as SDPA's ``attn_mask``): the CPU runs its flash kernel
      in eval (no [batch, heads, len, len] tensor), CUDA the math path (``_scaled_dot_product_attention_math``:
      q, k, v upcast to fp32, the scores and the softmax materialised, fused dropout), as the H200 measured it
      (flan-t5-large eval forward at batch 50: 4.33 GB allocated, 2.52 GB without the L^2 math tensors). Without a
      float mask (a causal LM's ``is_causal``, a bool mask) both devices run a fused kernel: left as traced.
    ``apply`` False: the CPU's own kernels (the emulated device's probes run them)."""
    if not apply:
        yield
        return
    functional = torch.nn.functional
    dropout, sdpa = functional.dropout, functional.scaled_dot_product_attention

    def fused_dropout(inp: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> torch.Tensor:
        if not training or p == 0.0 or not inp.is_floating_point():
            return dropout(inp, p, training, inplace)
        return torch.native_dropout(inp, p, True)[0]

    def cuda_sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        mask = kwargs.get("attn_mask", args[0] if args else None)
        if mask is None or not mask.is_floating_point():
            return sdpa(query, key, value, *args, **kwargs)
        return _math_attention(
            query, key, value, mask, *args[1:], **{k: v for k, v in kwargs.items() if k != "attn_mask"}
        )

    functional.dropout, functional.scaled_dot_product_attention = fused_dropout, cuda_sdpa  # type: ignore[assignment]
    try:
        yield
    finally:
        functional.dropout, functional.scaled_dot_product_attention = dropout, sdpa


def _math_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """ATen's ``_scaled_dot_product_attention_math`` as CUDA runs it (the tensors it allocates and autograd keeps):
    half inputs upcast to fp32 (``allowFP16BF16ReductionMathSDP`` off by default), the scaled q @ k^T, the float mask
    added in place, ``_safe_softmax``, CUDA's fused dropout, @ v, cast back (with the weights' cast it returns)."""
    origin = query.dtype
    if origin in _SDPA_MATH_UPCAST:
        query, key, value = query.float(), key.float(), value.float()
    if enable_gqa and key.size(-3) != query.size(-3):
        groups = query.size(-3) // key.size(-3)
        key, value = key.repeat_interleave(groups, -3), value.repeat_interleave(groups, -3)
    factor = math.sqrt(scale if scale is not None else 1.0 / math.sqrt(query.size(-1)))
    attn = torch.matmul(query * factor, (key * factor).transpose(-2, -1))
    if is_causal:
        causal = torch.ones(attn.shape[-2:], dtype=torch.bool).tril()
        attn = attn.masked_fill(causal.logical_not(), float("-inf"))
    attn.add_(mask)
    attn = torch.ops.aten._safe_softmax(attn, -1)
    if dropout_p > 0.0:
        attn = torch.native_dropout(attn, dropout_p, True)[0]
    out = torch.matmul(attn, value).to(origin)
    weights = attn.to(origin)  # the math path returns its weights cast back too; SDPA drops them
    del weights, attn
    return out
