"""How long `tuner explain` of the seed team's job takes, and `tuner estimate` of flan-t5-large at one length (issue 40
§2: "explain answers within 60 s on a 2-core CPU host, estimate within 30 s; a second run is seconds").

Makes the data once (not timed): a seeded synthetic set shaped like the team's (benchmarks.lengths_read: inputs mostly
60-600 words, 1 sample in 400 of 6,000-9,000 words), ``--samples`` of it (their 20,000), and its T5-like tokenizer.
Then times, each in a fresh process (imports count) with the trace cache empty (cold) and again (warm, every traced
point read from the cache; the data's lengths are cached from the cold run on):

- explain: `tuner explain` with their files (tests/data/seed: ds_config.json, training_args.json, oom.txt), the
  built-in flan-t5-large, 4 ranks of 79.15 GiB, their data;
- estimate: `tuner estimate --model builtin:flan-t5-large --micro-batch-size 2 --max-length 512`.

Prints one JSON line per run: the command, the seconds, the exit code, whether its stderr said the points were cached.
Run it with the machine to yourself (the timings are the point):

    nice .venv/bin/python -m benchmarks.explain_timing [--samples 20000] [--workdir /tmp/tuner-explain-bench]
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

from benchmarks.lengths_read import make_data, make_tokenizer

SEED = Path(__file__).resolve().parents[1] / "tests" / "data" / "seed"
TUNER = [sys.executable, "-m", "tuner"]
CAPACITY = "79.15GiB"  # as their OOM message says (rounded down to whole bytes)


def explain_cmd(data: Path, tokenizer: Path, storage: Path) -> list[str]:
    return [
        *TUNER,
        "explain",
        "--model",
        "builtin:flan-t5-large",
        "--baseline",
        str(SEED / "ds_config.json"),
        "--training-args",
        str(SEED / "training_args.json"),
        "--transformers-version",
        "4.57.3",  # their training args carry overwrite_output_dir: a 4.x release's
        "--world-size",
        "4",
        "--device-memory",
        CAPACITY,
        "--dataset",
        str(data),
        "--input-column",
        "source",
        "--target-column",
        "target",
        "--tokenizer",
        str(tokenizer),
        "--oom-message",
        f"@{SEED / 'oom.txt'}",
        "--storage",
        f"sqlite:///{storage}",
    ]


ESTIMATE = [*TUNER, "estimate", "--model", "builtin:flan-t5-large", "--micro-batch-size", "2", "--max-length", "512"]


def timed(name: str, cmd: list[str], env: dict[str, str]) -> dict[str, object]:
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    took = time.perf_counter() - t0
    return {"run": name, "s": round(took, 1), "rc": done.returncode, "cached": "point(s) cached" in done.stderr}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=20_000)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/tuner-explain-bench"))
    args = ap.parse_args()
    work: Path = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    data, tokenizer = work / f"data-{args.samples}.jsonl", work / "tokenizer"
    if not data.exists():
        make_data(data, args.samples)
    if not tokenizer.exists():
        make_tokenizer(tokenizer)
    cache = work / "cache"
    shutil.rmtree(cache, ignore_errors=True)  # cold: no trace, no lengths cached
    env = {**os.environ, "TUNER_CACHE_DIR": str(cache)}
    explain = explain_cmd(data, tokenizer, work / "t.db")
    for name, cmd in (("explain cold", explain), ("explain warm", explain)):
        print(json.dumps(timed(name, cmd, env)), flush=True)
    shutil.rmtree(cache / "traces", ignore_errors=True)
    for name, cmd in (("estimate cold", ESTIMATE), ("estimate warm", ESTIMATE)):
        print(json.dumps(timed(name, cmd, env)), flush=True)


if __name__ == "__main__":
    main()
