"""A fixed-length decode: exactly ``new_tokens`` tokens with the KV cache, no early stop.

``model.generate`` stops when every row has emitted EOS, which depends on the data (and cannot run on fake tensors,
whose values do not exist); the memory a job's eval generate needs is that of its longest decode, every row running to
the generation length. This runs that worst case: the encoder once (seq2seq), then one cached decoder step per token,
greedy, or over ``batch x beams`` rows for beam search (a beam search keeps that many rows and their caches; its
bookkeeping of scores is small beside them).
"""

from __future__ import annotations

from typing import Any

import torch


def fixed_length_decode(
    model: Any, batch: dict[str, torch.Tensor], new_tokens: int, beams: int = 1
) -> tuple[torch.Tensor, Any]:
    """Decodes ``new_tokens`` tokens for every row of ``batch`` (its input_ids / attention_mask); returns the tokens
    and the cache at the end (``past_key_values``: the generation cache at its largest)."""
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
            return tokens, past
        out = model(input_ids=ids, attention_mask=mask, use_cache=True)
        past, tokens = out.past_key_values, ids
        for _ in range(new_tokens):
            nxt = _pick(out.logits[:, -1, :], beams)[:, None]
            tokens = torch.cat([tokens, nxt], dim=1)
            mask = torch.cat([mask, torch.ones_like(nxt)], dim=1)
            out = model(input_ids=nxt, attention_mask=mask, past_key_values=past, use_cache=True)
            past = out.past_key_values
        return tokens, past


def _pick(logits: torch.Tensor, beams: int) -> torch.Tensor:
    """The next token per row: greedy argmax; under beam search the log-softmax over the vocabulary first (what
    beam search scores, a vocabulary-sized temporary per row)."""
    if beams > 1:
        return torch.log_softmax(logits.float(), dim=-1).argmax(dim=-1)
    return logits.argmax(dim=-1)
