"""A fixed-length decode: exactly ``new_tokens`` tokens with the KV cache, no early stop.

``model.generate`` stops when every row has emitted EOS, which depends on the data (and cannot run on fake tensors,
whose values do not exist); the memory a job's eval generate needs is that of its longest decode, every row running to
the generation length. This runs that worst case: the encoder once (seq2seq), then one cached decoder step per token,
greedy, or over ``batch x beams`` rows for beam search (a beam search keeps that many rows and their caches; its
bookkeeping of scores is small beside them).

``traced_decode`` is the trace's (trials.estimate, trials.trace_fsdp): a decode longer than
``trials.contract.TRACED_DECODE_STEPS`` is traced to that many tokens and the rest extrapolated from its last steps.
Each step past the first adds the same bytes (the cache's key / value rows, the token ids, a decoder-only mask's
column: every one linear in the tokens so far), so the peak and the cache of the last step grow by a constant a token;
a 128-token decode of flan-t5-large traced in full was the bulk of `tuner explain`'s minute.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from trials.contract import TRACED_DECODE_STEPS

if TYPE_CHECKING:
    from trials.memory import LiveTensorTracker


def fixed_length_decode(
    model: Any,
    batch: dict[str, torch.Tensor],
    new_tokens: int,
    beams: int = 1,
    on_step: Callable[[Any], None] | None = None,
) -> tuple[torch.Tensor, Any]:
    """Decodes ``new_tokens`` tokens for every row of ``batch`` (its input_ids / attention_mask); returns the tokens
    and the cache at the end (``past_key_values``: the generation cache at its largest). ``on_step(cache)`` after
    each token's step."""
    step = on_step or (lambda _cache: None)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    if beams > 1:
        ids, mask = ids.repeat_interleave(beams, dim=0), mask.repeat_interleave(beams, dim=0)
    encdec = bool(getattr(model.config, "is_encoder_decoder", False))
    with torch.no_grad():
        if encdec:
            encoded = model.get_encoder()(input_ids=ids, attention_mask=mask)
            start = int(getattr(model.config, "decoder_start_token_id", 0) or 0)
            tokens = torch.full((ids.shape[0], 1), start, dtype=torch.long, device=ids.device)
            past = None
            for _ in range(new_tokens):
                out = model(
                    encoder_outputs=encoded,
                    attention_mask=mask,
                    decoder_input_ids=tokens[:, -1:],
                    past_key_values=past,
                    use_cache=True,
                )
                past = out.past_key_values
                tokens = torch.cat([tokens, _pick(out.logits[:, -1, :], beams)[:, None]], dim=1)
                step(past)
            return tokens, past
        out = model(input_ids=ids, attention_mask=mask, use_cache=True)
        past, tokens = out.past_key_values, ids
        for _ in range(new_tokens):
            nxt = _pick(out.logits[:, -1, :], beams)[:, None]
            tokens = torch.cat([tokens, nxt], dim=1)
            mask = torch.cat([mask, torch.ones_like(nxt)], dim=1)
            out = model(input_ids=nxt, attention_mask=mask, past_key_values=past, use_cache=True)
            past = out.past_key_values
            step(past)
        return tokens, past


def _pick(logits: torch.Tensor, beams: int) -> torch.Tensor:
    """The next token per row: greedy argmax; under beam search the log-softmax over the vocabulary first (what
    beam search scores, a vocabulary-sized temporary per row)."""
    if beams > 1:
        return torch.log_softmax(logits.float(), dim=-1).argmax(dim=-1)
    return logits.argmax(dim=-1)


def traced_decode(
    model: Any,
    batch: dict[str, torch.Tensor],
    new_tokens: int,
    beams: int,
    tracker: LiveTensorTracker,
    traced_steps: int | None = None,
) -> tuple[int, int]:
    """(the peak on ``tracker`` from its last reset, the cache's bytes at the end) of a ``new_tokens`` decode: at most
    ``traced_steps`` tokens traced, a longer decode's last step extrapolated by the growth a token of the last traced
    steps (the peak is the larger of the traced one, e.g. the encoder's, and that last step's)."""
    from trials.trace_model import cache_bytes

    steps = min(new_tokens, TRACED_DECODE_STEPS if traced_steps is None else traced_steps)
    peaks: list[int] = []
    caches: list[int] = []
    top = 0

    def each(cache: Any) -> None:
        nonlocal top
        top = max(top, tracker.peak)
        peaks.append(tracker.peak)
        caches.append(cache_bytes(cache))
        tracker.reset_peak()  # the next step's own peak

    _tokens, cache = fixed_length_decode(model, batch, steps, beams, on_step=each)
    top = max(top, tracker.peak)
    more = new_tokens - steps
    if more <= 0 or len(peaks) < 8:
        return top, cache_bytes(cache)
    return _extrapolated(top, peaks, caches, more, tracker)


def _extrapolated(
    top: int, peaks: list[int], caches: list[int], more: int, tracker: LiveTensorTracker
) -> tuple[int, int]:
    """The last step ``more`` tokens on, by the growth a token over the last quarter of the traced steps (the first
    steps' peaks are other allocations': tiny T5's grow by one amount a token to its 7th, by another from there)."""
    h = max(1, len(peaks) // 4)
    per_peak = max(0, peaks[-1] - peaks[-1 - h]) / h
    per_cache = max(0, caches[-1] - caches[-1 - h]) / h
    tracker.peak = max(top, peaks[-1] + math.ceil(per_peak * more))
    return tracker.peak, caches[-1] + math.ceil(per_cache * more)
