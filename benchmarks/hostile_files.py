"""Issue 42's hostile inputs at full size, each through the real `tuner` in a subprocess: exit status, wall seconds,
peak RSS and the size of tuner's cache, one row each (benchmarks/BENCHMARKS.md, "Untrusted files, third round").

    python -m benchmarks.hostile_files [--only NAME ...] [--keep DIR]

The inputs are built in a temporary folder (about 250 MB on disk at once); the tests (tests/test_bad_input_42.py) run
smaller ones. A row's bound is the issue's: rc 0 or 2, RSS under 1 GiB, cache under 200 MB.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

MiB = 1 << 20
GOOD = '{"source": "w1 w2", "target": "w3"}\n'
DEEP = '{"source": "w1", "target": "w2", "junk": ' + "[" * 20_000 + "]" * 20_000 + "}\n"
_MEASURED = (
    "import resource, subprocess, sys\n"
    "done = subprocess.run([sys.executable, '-c', 'from tuner.cli import main; main()', *sys.argv[1:]],"
    " capture_output=True, text=True)\n"
    "print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, flush=True)\n"
    "print(done.stderr.strip().splitlines()[-1][:160] if done.stderr.strip() else '')\n"
)


def _lengths(root: Path, data: Path) -> list[str]:
    columns = ["--input-column", "source", "--target-column", "target", "--no-progress"]
    return ["lengths", "--dataset", str(data), "--tokenizer", str(root / "tok"), *columns]


def gz_deep(root: Path) -> list[str]:
    folder = root / "gz"
    folder.mkdir()
    (folder / "train.jsonl").write_text(GOOD)
    (folder / "test.jsonl.gz").write_bytes(gzip.compress((GOOD + DEEP).encode(), 9))
    return _lengths(root, folder)


def escaped_quotes(root: Path) -> list[str]:
    data = root / "open.jsonl"
    data.write_text(GOOD + '{"source": "' + '{\\"' * (4 * MiB // 3 - 10) + "\n")
    return _lengths(root, data)


def parquet_dictionary(root: Path) -> list[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = 100_000
    junk = pa.array(["x" * 20_000] * rows).dictionary_encode()
    pq.write_table(pa.table({"source": ["w1 w2"] * rows, "target": ["w3"] * rows, "junk": junk}), root / "d.parquet")
    return _lengths(root, root / "d.parquet")


def csv_line(root: Path) -> list[str]:
    data = root / "long.csv"
    with open(data, "w") as fh:
        fh.write('source,target\n"w1 w2",w3\n"')
        for _ in range(149):
            fh.write("w1 " * (MiB // 3))
        fh.write('",w3\n')
    return _lengths(root, data)


def json_lines_4mib(root: Path) -> list[str]:
    data = root / "big.jsonl"
    line = json.dumps({"source": "w1 " * ((4 * MiB - 2000) // 3), "target": "w2"}) + "\n"
    data.write_text(line * 25)
    return _lengths(root, data)


def yaml_aliases(root: Path) -> list[str]:
    text = (
        "compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nmixed_precision: bf16\nnum_processes: 1\n"
        "fsdp_config:\n  fsdp_version: 2\n"
        f'junk: &big "{"x" * MiB}"\nmore: [{", ".join(["*big"] * 3000)}]\n'
    )
    (root / "acc.yaml").write_text(text)
    (root / "args.json").write_text(json.dumps({"per_device_train_batch_size": 2, "output_dir": "o"}))
    files = ["--baseline", str(root / "acc.yaml"), "--training-args", str(root / "args.json")]
    return ["search", "--budget", "1m", "--storage", f"sqlite:///{root}/y.db", *files]


def yaml_plain_4mib(root: Path) -> list[str]:
    text = "".join(f"key_{i}: value_{i}\n" for i in range(220_000))[: 4 * MiB - 100].rsplit("\n", 1)[0] + "\n"
    (root / "space.yaml").write_text(text)
    return ["search", "--budget", "1m", "--storage", f"sqlite:///{root}/p.db", "--space", str(root / "space.yaml")]


CASES: dict[str, Callable[[Path], list[str]]] = {
    "1-jsonl-gz-20000-deep": gz_deep,
    "2-4mib-escaped-quotes": escaped_quotes,
    "3-yaml-3000-aliases": yaml_aliases,
    "3-yaml-plain-4mib": yaml_plain_4mib,
    "5-parquet-dictionary-2gb": parquet_dictionary,
    "5-csv-149mb-line": csv_line,
    "5-jsonl-25x4mib": json_lines_4mib,
}


def _du(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.exists() else 0


def run(name: str, root: Path) -> str:
    case = root / name
    case.mkdir()
    from tests.helpers.seq2seq_data import save_tokenizer

    save_tokenizer(case / "tok")
    argv = CASES[name](case)
    env = {**os.environ, "TUNER_CACHE_DIR": str(case / "cache"), "COLUMNS": "400"}
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", _MEASURED, *argv], capture_output=True, text=True, env=env)
    wall = time.monotonic() - start
    first, *rest = done.stdout.splitlines()
    rc, rss = (int(x) for x in first.split())
    said = rest[0] if rest else ""
    return (
        f"{name:26} rc {rc:3}  {wall:7.1f} s  {rss / 1024:7.0f} MiB  cache {_du(case / 'cache') / MiB:7.1f} MiB  {said}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=sorted(CASES), default=sorted(CASES))
    parser.add_argument("--keep", type=Path, help="build the inputs here and keep them")
    args = parser.parse_args()
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        for name in args.only:
            print(run(name, root), flush=True)


if __name__ == "__main__":
    main()
