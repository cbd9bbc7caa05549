"""Reading a dataset's token lengths (issue 21): ``python -m benchmarks.lengths_read``.

Makes a seeded synthetic seq2seq set shaped like the seed team's (JSON lines; inputs mostly 60-600 words, 1 sample in
400 of 6,000-9,000 words; targets 5-60 words) and a T5-like fast tokenizer (a `tokenizers` Unigram model with the
Metaspace pre-tokenizer, as T5's sentencepiece tokenizer converts to, whose pieces are the set's words, so a word
is one token, saved with save_pretrained). Neither is timed. Then times, each in a fresh process (so imports count):

- cold: ``read_lengths`` with an empty cache (load_dataset's JSON -> Arrow conversion + the batched tokenizing map);
- cached: the same call again (reads the cached lengths; no `datasets`, no tokenizer);
- cached CLI: the whole ``tuner lengths`` command on the cached lengths (interpreter start, CLI imports, printing).

    nice .venv/bin/python -m benchmarks.lengths_read [--samples 100000] [--workdir /tmp/tuner-lengths-bench]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

READ = """
import json, sys, time
from pathlib import Path
t0 = time.perf_counter()
from tuner.job.dataset import DataSource, read_lengths
src = DataSource(sys.argv[1], input_column="source", target_column="target")
r = read_lengths(src, sys.argv[2], Path(sys.argv[3]), progress=False)
took = time.perf_counter() - t0
inputs, targets = r.lengths.input, r.lengths.target
print(json.dumps({"s": took, "cached": r.cached, "n": len(r.lengths), "input_max": int(inputs.max()),
                  "input_p50": int(sorted(inputs)[len(inputs) // 2]), "tokens": int(inputs.sum() + targets.sum())}))
"""


def lexicon(size: int, rng: np.random.Generator) -> np.ndarray:
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    return np.array(["".join(rng.choice(letters, rng.integers(2, 11))) for _ in range(size)])


def make_data(path: Path, samples: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    words = lexicon(20_000, rng)
    zipf = 1.0 / np.arange(1, len(words) + 1)
    zipf /= zipf.sum()
    n_in = np.clip(rng.lognormal(np.log(180), 0.6, samples), 60, 600).astype(int)
    tail = rng.random(samples) < 1 / 400
    n_in[tail] = rng.integers(6000, 9001, int(tail.sum()))
    n_tgt = rng.integers(5, 61, samples)
    stream = rng.choice(len(words), int(n_in.sum() + n_tgt.sum()), p=zipf)
    at = 0
    with path.open("w") as f:
        for a, b in zip(n_in.tolist(), n_tgt.tolist(), strict=True):
            src = " ".join(words[stream[at : at + a]])
            tgt = " ".join(words[stream[at + a : at + a + b]])
            at += a + b
            f.write(json.dumps({"source": src, "target": tgt}) + "\n")


def make_tokenizer(out: Path, seed: int = 0) -> None:
    """A Unigram model over the lexicon's words (as '▁word' pieces, Zipf log-probabilities) plus single letters, so
    that a word is one token as T5's tokenizer mostly makes of English words; Metaspace, '</s>' after every text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = lexicon(20_000, np.random.default_rng(seed))
    special = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    pieces = [(f"\u2581{w}", float(-np.log(k + 1)) - 1.0) for k, w in enumerate(dict.fromkeys(words.tolist()))]
    letters = [(c, -20.0) for c in "\u2581abcdefghijklmnopqrstuvwxyz"]
    core = Tokenizer(models.Unigram(special + pieces + letters, unk_id=2, byte_fallback=False))
    core.pre_tokenizer = pre_tokenizers.Metaspace()
    core.decoder = decoders.Metaspace()
    core.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", 1)]
    )
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")
    tok.save_pretrained(out)


def timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, str]:
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    return time.perf_counter() - t0, done.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=100_000)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/tuner-lengths-bench"))
    args = ap.parse_args()
    work: Path = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    data, tok, cache = work / f"data-{args.samples}.jsonl", work / "tokenizer", work / "cache"
    if not data.is_file():
        make_data(data, args.samples)
    if not tok.is_dir():
        make_tokenizer(tok)
    shutil.rmtree(cache, ignore_errors=True)
    read = [sys.executable, "-c", READ, str(data), str(tok), str(cache)]
    cold_wall, cold = timed(read)
    warm_wall, warm = timed(read)
    cli = [sys.executable, "-m", "tuner", "lengths", "--dataset", str(data), "--tokenizer", str(tok)]
    cli += ["--input-column", "source", "--target-column", "target"]
    cli_wall, _ = timed([*cli, "--no-progress"], {**os.environ, "TUNER_CACHE_DIR": str(cache)})
    c, w = json.loads(cold), json.loads(warm)
    assert not c["cached"] and w["cached"] and c["n"] == w["n"] == args.samples
    print(
        f"{args.samples:,} samples ({c['tokens']:,} tokens; inputs p50 {c['input_p50']}, max {c['input_max']:,}): "
        f"cold read_lengths {c['s']:.1f} s (process {cold_wall:.1f} s); cached {w['s']:.3f} s "
        f"(process {warm_wall:.2f} s); cached `tuner lengths` {cli_wall:.2f} s"
    )


if __name__ == "__main__":
    main()
