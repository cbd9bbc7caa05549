"""A tiny T5 and its tokenizer saved together with save_pretrained (the tokenizer built offline with the `tokenizers`
library: a word-level vocabulary of lower-case words, an end-of-sequence token after every text, as T5's), and a
JSON-lines seq2seq dataset whose input lengths have a long tail: most samples are short, a few are very long.

Lengths are exact by construction: a text of ``n`` vocabulary words tokenizes to ``n + 1`` tokens (the ``</s>``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tuner.job.lengths import SampleLengths

WORDS = [f"w{k}" for k in range(200)]
SPECIAL = ["<pad>", "</s>", "<unk>"]


def save_tokenizer(directory: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL + WORDS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", vocab["</s>"])]
    )
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")
    tok.save_pretrained(directory)
    return directory


def save_tiny_t5(directory: Path) -> Path:
    """The model and its tokenizer in one save_pretrained directory (what AutoTokenizer(model dir) reads)."""
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(
        vocab_size=len(SPECIAL) + len(WORDS),
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        pad_token_id=0,
        eos_token_id=1,
    )
    config.decoder_start_token_id = 0  # not in T5Config's typed signature under transformers 5: set after
    T5ForConditionalGeneration(config).save_pretrained(directory)
    return save_tokenizer(directory)


def long_tail_lengths(n: int, seed: int = 0, tail_every: int = 50, tail: tuple[int, int] = (300, 400)) -> np.ndarray:
    """Input word counts: mostly 5-40 words, one sample in ``tail_every`` from the ``tail`` range."""
    rng = np.random.default_rng(seed)
    words = rng.integers(5, 41, n)
    long = rng.random(n) < 1 / tail_every
    words[long] = rng.integers(tail[0], tail[1] + 1, int(long.sum()))
    return words


def write_jsonl(path: Path, input_words: np.ndarray, seed: int = 1, target_words: tuple[int, int] = (2, 12)) -> Path:
    """One {"source", "target", "id"} object per line; returns the path."""
    rng = np.random.default_rng(seed)
    targets = rng.integers(target_words[0], target_words[1] + 1, len(input_words))
    vocab = np.array(WORDS)
    with path.open("w") as f:
        for k, (n_in, n_tgt) in enumerate(zip(input_words.tolist(), targets.tolist(), strict=True)):
            src = " ".join(vocab[rng.integers(0, len(WORDS), n_in)])
            tgt = " ".join(vocab[rng.integers(0, len(WORDS), n_tgt)])
            f.write(json.dumps({"source": src, "target": tgt, "id": k}) + "\n")
    return path


def expected_lengths(path: Path) -> tuple[list[int], list[int]]:
    """The token lengths of a written file, counted the fixture's way (words + the end-of-sequence token)."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [len(r["source"].split()) + 1 for r in rows], [len(r["target"].split()) + 1 for r in rows]


def seed_shaped(n: int, seed: int = 0) -> SampleLengths:
    """The seed team's shape: inputs 60-600 tokens, 1 in 400 of 6,000-9,000; targets
    5-60 (each + the end-of-sequence token)."""
    rng = np.random.default_rng(seed)
    inputs = np.clip(rng.lognormal(np.log(180), 0.6, n), 60, 600).astype(int)
    tail = rng.random(n) < 1 / 400
    inputs[tail] = rng.integers(6000, 9001, int(tail.sum()))
    return SampleLengths.of(inputs + 1, rng.integers(5, 61, n) + 1)
