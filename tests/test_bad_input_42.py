"""Bad input, issue 42 ("untrusted files, third round"): every data format bounded before its reader, YAML bounded after
its aliases, snapshots read under one budget, every echo cut, the FSDP2 import without a traceback. Each case failed
on main before its fix (a segfault, hours of CPU, gigabytes of memory or cache, a traceback, another file's lengths,
a line of megabytes); each now ends with one line and exit 2 (a 4xx from the API) or a bounded success.

A case that crashed or blew up before runs the real `tuner` in a subprocess (peak memory measured by a parent that
does nothing else); the others run the entry point in-process, as tests/test_bad_input.py does."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.helpers.seq2seq_data import save_tokenizer, write_jsonl
from tests.test_bad_input import _one_error_line
from tuner.cli import main as tuner_main

MiB = 1 << 20
GOOD = '{"source": "w1 w2", "target": "w3"}\n'
DEEP = '{"source": "w1", "target": "w2", "junk": ' + "[" * 20_000 + "]" * 20_000 + "}\n"
# runs `tuner` and prints its exit status and peak RSS (KiB) last: the parent starts nothing else
_MEASURED = (
    "import resource, subprocess, sys\n"
    "done = subprocess.run([sys.executable, '-c', 'from tuner.cli import main; main()', *sys.argv[1:]])\n"
    "print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)\n"
)


def _tuner(env: dict[str, str], *args: str, timeout: float = 300) -> tuple[int, str, str, int]:
    """(exit status, stdout, stderr less the last line, peak RSS in bytes) of `tuner ARGS` in a subprocess."""
    out = subprocess.run(
        [sys.executable, "-c", _MEASURED, *args], capture_output=True, text=True, env=env, timeout=timeout
    )
    *rest, last = out.stderr.rstrip("\n").split("\n")
    rc, rss = (int(x) for x in last.split())
    return rc, out.stdout, "\n".join(rest), rss * 1024


def _one_line(rc: int, stderr: str) -> str:
    assert rc == 2, (rc, stderr[-2000:])
    return _one_error_line(stderr)


def _in_process(argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> str:
    monkeypatch.setenv("COLUMNS", "400")
    monkeypatch.setattr(sys, "argv", ["tuner", *argv])
    with pytest.raises(SystemExit) as exit_info:
        tuner_main()
    line = _one_error_line(capsys.readouterr().err)
    assert exit_info.value.code == 2, line
    return line


def _out(argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> str:
    monkeypatch.setenv("COLUMNS", "400")
    monkeypatch.setattr(sys, "argv", ["tuner", *argv])
    tuner_main()
    return capsys.readouterr().out


def _du(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.exists() else 0


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("bad42")
    tok = save_tokenizer(root / "tok")
    env = {**os.environ, "TUNER_CACHE_DIR": str(root / "cache"), "COLUMNS": "400"}
    return {"root": root, "tok": tok, "env": env}


def _lengths(world: dict[str, Any], dataset: Path | str) -> list[str]:
    return [
        "lengths",
        "--dataset",
        str(dataset),
        "--tokenizer",
        str(world["tok"]),
        "--input-column",
        "source",
        "--target-column",
        "target",
        "--no-progress",
    ]


# -- §1: every file `datasets` reads is pre-scanned: .ndjson and compressed JSON lines too -------------------------
@pytest.mark.parametrize("name", ["test.jsonl.gz", "test.ndjson", "test.json.bz2", "test.jsonl.xz"])
def test_a_deep_line_in_any_json_file_of_a_folder_is_one_line(name: str, world: dict[str, Any], tmp_path: Path) -> None:
    """A split tuner does not even read (`datasets` builds every split) segfaulted pyarrow: rc 139 before."""
    import bz2
    import lzma

    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "train.jsonl").write_text(GOOD)
    data = (GOOD + DEEP).encode()
    packed = {"gz": gzip.compress, "bz2": bz2.compress, "xz": lzma.compress}.get(name.rsplit(".", 1)[1], bytes)
    (folder / name).write_bytes(packed(data))
    rc, _, err, _ = _tuner(world["env"], *_lengths(world, folder))
    line = _one_line(rc, err)
    assert "nests deeper than 64" in line and name in line and "line 2" in line, line


def test_a_gzip_bomb_is_refused_while_it_is_decompressed(
    world: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tuner.job import data_formats

    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "train.jsonl").write_text(GOOD)
    with gzip.open(folder / "test.jsonl.gz", "wb") as fh:
        for _ in range(64):
            fh.write((GOOD * (MiB // len(GOOD))).encode())
    monkeypatch.setattr(data_formats, "MAX_DATA_BYTES", 32 * MiB)  # the bound as a smaller host would have it
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    line = _in_process(_lengths(world, folder), monkeypatch, capsys)
    assert "test.jsonl.gz" in line and "decompresses to over 32.0 MiB" in line, line


# -- §2: the pre-scan is linear: a string that never closes costs no more than any other --------------------------
@pytest.mark.timeout(120)  # about 20 hours before (the string pattern backtracked from every quote)
def test_a_line_of_escaped_quotes_that_never_closes_is_scanned_in_linear_time(
    world: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "open.jsonl"
    data.write_text(GOOD + '{"source": "' + '{\\"' * (4 * MiB // 3 - 10) + "\n")
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    line = _in_process(_lengths(world, data), monkeypatch, capsys)
    assert "could not be read" in line and len(line) < 600, line


# -- §5: formats without a bound ------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_parquet_whose_unused_column_decodes_to_2_gb_costs_no_cache(world: dict[str, Any], tmp_path: Path) -> None:
    """1,664 bytes: one 20 KB string dictionary-encoded over 100,000 rows in a column tuner never tokenizes. Before:
    2.0 GB written into tuner's cache at 2.3 GB RSS."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = 100_000
    junk = pa.array(["x" * 20_000] * rows).dictionary_encode()
    table = pa.table({"source": ["w1 w2"] * rows, "target": ["w3"] * rows, "junk": junk})
    pq.write_table(table, tmp_path / "train.parquet", compression="zstd")
    assert (tmp_path / "train.parquet").stat().st_size < 4096
    env = {**world["env"], "TUNER_CACHE_DIR": str(tmp_path / "cache")}
    rc, out, err, rss = _tuner(env, *_lengths(world, tmp_path / "train.parquet"), timeout=600)
    assert rc == 0, err[-2000:]
    assert out.startswith("100,000 samples of"), out
    assert _du(tmp_path / "cache") < 200 * MiB and rss < 1024 * MiB, (_du(tmp_path / "cache"), rss)


@pytest.mark.parametrize(
    ("column", "says"),
    [("dict-20k", "decodes to over 64.0 MiB"), ("pair", "holds list<element: string>, not text")],
)
def test_a_parquet_text_column_is_measured_before_it_is_loaded(
    column: str,
    says: str,
    world: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tuner.job import data_formats

    rows = 10_000
    source = {
        "dict-20k": pa.array(["w1 " * 7_000] * rows).dictionary_encode(),
        "pair": pa.array([["w1", "w2"]] * rows),
    }[column]
    pq.write_table(pa.table({"source": source, "target": ["w3"] * rows}), tmp_path / "train.parquet")
    monkeypatch.setattr(data_formats, "MAX_DATA_BYTES", 64 * MiB)
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    line = _in_process(_lengths(world, tmp_path / "train.parquet"), monkeypatch, capsys)
    assert says in line and "train.parquet" in line, line
    assert _du(tmp_path / "cache" / "datasets") < MiB


def test_a_csv_record_over_4_mib_is_one_line(
    world: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """One 149 MB CSV line passed 4 GB before; a quoted field that runs over lines is one record."""
    data = tmp_path / "train.csv"
    data.write_text('source,target\n"w1 w2",w3\n"' + "w1 \n" * (5 * MiB // 4) + '",w3\n')
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    line = _in_process(_lengths(world, data), monkeypatch, capsys)
    assert "train.csv' record at line 3 is longer than 4 MiB" in line, line


@pytest.mark.slow
def test_json_lines_of_4_mib_each_are_tokenized_in_bounded_memory(world: dict[str, Any], tmp_path: Path) -> None:
    """Six samples of 3.3 MiB: one tokenizing batch held all six (1.8 GB RSS); now a batch holds 2 MiB of text."""
    data = tmp_path / "big.jsonl"
    data.write_text((json.dumps({"source": "w1 " * 1_148_576, "target": "w2"}) + "\n") * 6)
    env = {**world["env"], "TUNER_CACHE_DIR": str(tmp_path / "cache")}
    rc, out, err, rss = _tuner(env, *_lengths(world, data), timeout=600)
    assert rc == 0 and out.startswith("6 samples of"), err[-2000:]
    assert rss < 1024 * MiB, rss


# -- §7: a saved dataset's files lie inside its folder; the cache key covers every file read -----------------------
@pytest.mark.parametrize("where", ["relative", "absolute"])
def test_a_saved_dataset_naming_a_file_outside_its_folder_is_one_line(
    where: str,
    world: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import datasets

    saved = tmp_path / "saved"
    outside = tmp_path / "outside"
    datasets.Dataset.from_dict({"source": ["w1 w2"], "target": ["w3"]}).save_to_disk(str(saved))
    datasets.Dataset.from_dict({"source": [" ".join(["w1"] * 500)] * 7, "target": ["w3"] * 7}).save_to_disk(
        str(outside)
    )
    shard = next(outside.glob("*.arrow"))
    state = json.loads((saved / "state.json").read_text())
    state["_data_files"] = [{"filename": f"../outside/{shard.name}" if where == "relative" else str(shard)}]
    (saved / "state.json").write_text(json.dumps(state))
    capsys.readouterr()  # the progress bars of the saves above
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    line = _in_process(_lengths(world, saved), monkeypatch, capsys)
    assert "names a data file outside it" in line and shard.name in line, line
    assert not (tmp_path / "cache" / "lengths").exists()  # nothing cached from outside the folder


# -- §10: a pair column, a FIFO ------------------------------------------------------------------------------------
def test_a_column_of_string_pairs_is_not_tokenized_as_a_sentence_pair(
    world: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "pairs.jsonl"
    data.write_text('{"source": ["w1 w2", "w3"], "target": "w3"}\n' * 3)
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    line = _in_process(_lengths(world, data), monkeypatch, capsys)
    assert "column 'source' holds List(Value('string')), not text" in line, line


def test_a_fifo_dataset_is_not_looked_up_on_the_hub(
    world: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = tmp_path / "data.jsonl"
    os.mkfifo(fifo)
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    line = _in_process(_lengths(world, fifo), monkeypatch, capsys)
    assert "is not a regular file or folder" in line and "Hub" not in line, line


def test_the_lengths_cache_is_bounded(
    world: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tuner.job import dataset

    monkeypatch.setattr(dataset, "MAX_CACHE_BYTES", 1)  # keeps only the newest file
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    for k in range(3):
        data = write_jsonl(tmp_path / f"d{k}.jsonl", np.array([3 + k]))
        assert _out(_lengths(world, data), monkeypatch, capsys).startswith("1 samples of")
    assert len(list((tmp_path / "cache" / "lengths").glob("*.npz"))) == 1


# -- §8: one time budget for all of an explain's snapshots; a memory limit within the host's own ----------------------
def _colliding(path: Path, keys: int = 200_000) -> Path:
    """A 2.8 MB pickle of ``keys`` int keys that all hash alike (k x (2**61 - 1)): the C unpickler's dict takes
    minutes. Written opcode by opcode (building the dict here would take as long)."""
    parts = [b"\x80\x02}(", b"X\x08\x00\x00\x00segments]"]
    for k in range(1, keys + 1):
        raw = (k * ((1 << 61) - 1)).to_bytes(10, "little", signed=True)
        parts.append(b"\x8a\x0a" + raw + b"K\x00")
    path.write_bytes(b"".join([*parts, b"u."]))
    return path


@pytest.mark.timeout(120)  # three of these one after another took 3 x 120 s before
def test_an_explains_snapshots_share_one_time_budget(tmp_path: Path) -> None:
    from tuner.memory.snapshot_child import read_all

    paths = [str(_colliding(tmp_path / f"rank{k}.pickle")) for k in range(3)]
    reads = read_all(paths, budget_s=4, workers=2)
    assert [r.parts for r in reads] == [None, None, None]
    stopped = [r.error for r in reads if r.error and "reading it took over 4 s (the 3 snapshots" in r.error]
    waited = [r.error for r in reads if r.error and r.error.startswith("not read: the 4 s for this explain's 3")]
    assert len(stopped) == 2 and len(waited) == 1, [r.error for r in reads]


def _read_under(limit: int, path: Path) -> dict[str, Any]:
    """``snapshot_child.read(path)`` in a process whose address space the host limits to ``limit`` (ulimit -v)."""
    code = (
        "import json, resource, sys\n"
        f"resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))\n"
        "from tuner.memory.snapshot_child import read\n"
        "got = read(sys.argv[1])\n"
        "print(json.dumps({'error': got.error, 'live': got.parts.live if got.parts else None}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_a_snapshot_reads_under_a_hosts_lower_address_space_limit(tmp_path: Path) -> None:
    """Under `ulimit -v` below the child's 5 GiB every snapshot, a good one too, read as "not a snapshot torch wrote"
    before; now the child's limit is the host's, and a snapshot that needs more says the limit stopped it."""
    import pickle

    from tests.tuner.memory.test_snapshot_parts import block, frame, snapshot

    good = tmp_path / "good.pickle"
    good.write_bytes(pickle.dumps(snapshot(block(MiB, [frame("/w/torch/optim/adam.py", "step")]))))
    assert _read_under(2 << 30, good) == {"error": None, "live": MiB}
    many = snapshot(*(block(MiB, [frame(f"/w/f{k}.py", f"fn{k}")]) for k in range(300_000)))
    large = tmp_path / "large.pickle"
    large.write_bytes(pickle.dumps(many))
    got = _read_under(300 * MiB, large)
    assert got["live"] is None and "this host allows a process (ulimit -v)" in got["error"], got


# -- §3: YAML bounded after its aliases, read by libyaml, every constructor error one line ---------------------------
ARGS = {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 1, "output_dir": "out", "max_seq_length": 32}
ACCELERATE = (
    "compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nmixed_precision: bf16\nnum_processes: 1\n"
    "fsdp_config:\n  fsdp_version: 2\n  fsdp_auto_wrap_policy: NO_WRAP\n"
)


def _accelerate(tmp_path: Path, extra: str) -> list[str]:
    (tmp_path / "acc.yaml").write_text(ACCELERATE + extra)
    (tmp_path / "args.json").write_text(json.dumps(ARGS))
    db = f"sqlite:///{tmp_path}/t.db"
    files = ["--baseline", f"{tmp_path}/acc.yaml", "--training-args", f"{tmp_path}/args.json"]
    return ["search", "--budget", "1m", "--storage", db, *files]


@pytest.mark.parametrize("refs", [100, 3_000])
def test_a_yaml_alias_bomb_is_refused_before_it_is_expanded(refs: int, world: dict[str, Any], tmp_path: Path) -> None:
    """A 1 MiB string referenced 3,000 times (1.06 MB) passed both bounds and `json.dumps` wrote past 4 GB into the
    study definition; 100 times stored a 106 MB row that every later read paid for."""
    extra = 'junk: &big "' + "x" * MiB + '"\nmore: [' + ", ".join(["*big"] * refs) + "]\n"
    rc, _, err, rss = _tuner(world["env"], *_accelerate(tmp_path, extra), timeout=300)
    line = _one_line(rc, err)
    assert "acc.yaml' holds over 4 MiB once its aliases are expanded" in line, line
    assert rss < 1024 * MiB and _du(tmp_path) < 20 * MiB, (rss, _du(tmp_path))


def test_a_plain_4_mib_yaml_is_refused_by_libyaml_in_bounded_memory(world: dict[str, Any], tmp_path: Path) -> None:
    """PyYAML's pure-Python loader took 64 s and 1.45 GB before refusing it (here 520,000 small mappings, no alias:
    1.36 GB and 150 s)."""
    extra = "junk: [" + "{a: 1}, " * ((4 * MiB - len(ACCELERATE) - 20) // 8) + "{a: 1}]\n"
    rc, _, err, rss = _tuner(world["env"], *_accelerate(tmp_path, extra), timeout=600)
    line = _one_line(rc, err)
    assert "holds more than 10000 keys and items" in line, line
    assert rss < 1024 * MiB, rss


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ("when: 2001-13-45\n", "holds a value YAML cannot read: month must be in 1..12"),
        ("big: " + "9" * 5_000 + "\n", "holds a value YAML cannot read: Exceeds the limit (4300 digits)"),
        ("self: &me [1, *me]\n", "has an alias *me to a node that contains it"),
    ],
    ids=["impossible-date", "5000-digits", "self-alias"],
)
def test_a_yaml_value_its_constructor_refuses_is_one_line(
    extra: str, says: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    line = _in_process(_accelerate(tmp_path, extra), monkeypatch, capsys)
    assert says in line and len(line) < 600, line


def test_a_space_file_alias_bomb_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("x: &x [" + ", ".join(["1"] * 100) + "]\ny: &y [" + ", ".join(["*x"] * 100) + "]\n")
    line = _in_process(["search", "--budget", "1m", "--space", str(space)], monkeypatch, capsys)
    assert "more than 10000 keys and items once its aliases are expanded" in line, line


def test_a_data_folders_readme_alias_bomb_is_one_line(
    world: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`datasets` parses a data folder's README front matter with PyYAML's pure-Python loader."""
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "train.jsonl").write_text(GOOD)
    aliases = ", ".join(["*big"] * 200)
    (folder / "README.md").write_text(f'---\nbig: &big "{"x" * MiB}"\ntags: [{aliases}]\n---\n# data\n')
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    line = _in_process(_lengths(world, folder), monkeypatch, capsys)
    assert "front matter holds over 4 MiB once its aliases are expanded" in line, line


# -- §9: every echo of user text bounded ---------------------------------------------------------------------------
def test_a_3_mb_key_is_not_echoed_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = {**ARGS, "fsdp": "full_shard", "fsdp_config": {"k" * (3 * MiB): 1}}
    (tmp_path / "args.json").write_text(json.dumps(args))
    line = _in_process(["doctor", "--training-args", str(tmp_path / "args.json")], monkeypatch, capsys)
    assert len(line) < 2200 and "kkkk" in line, len(line)


def test_a_5_mb_model_config_with_auto_map_names_tuners_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Past the 4 MiB pre-check transformers refused it in its own words (pass trust_remote_code=True)."""
    folder = tmp_path / "model"
    folder.mkdir()
    config = {"model_type": "evil", "auto_map": {"AutoConfig": "evil.EvilConfig"}, "pad": "x" * (5 * MiB)}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "evil.py").write_text(f"import pathlib\npathlib.Path({str(tmp_path / 'RAN')!r}).write_text('ran')\n")
    argv = ["estimate", "--model", str(folder), "--micro-batch-size", "1", "--max-length", "8"]
    line = _in_process(argv, monkeypatch, capsys)
    assert "wants its own code run (config.json auto_map 'in a file too large to read whole" in line, line
    assert "tuner --trust-remote-code" in line and not (tmp_path / "RAN").exists()


# -- §10: numbers JSON has not, keys given twice, buckets past any device -------------------------------------------
@pytest.mark.parametrize(
    ("flag", "content", "says"),
    [
        ("--training-args", '{"per_device_train_batch_size": 2, "learning_rate": NaN}', "holds NaN, not a finite"),
        ("--training-args", '{"per_device_train_batch_size": 2, "max_grad_norm": -Infinity}', "holds -Infinity"),
        (
            "--ds-config",
            '{"train_micro_batch_size_per_gpu": 2, "train_micro_batch_size_per_gpu": 64}',
            "has the key 'train_micro_batch_size_per_gpu' twice",
        ),
        (
            "--ds-config",
            '{"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2, "reduce_bucket_size": 1e308}}',
            "reduce_bucket_size must be an integer >= 1 (at most 9,007,199,254,740,992)",
        ),
    ],
    ids=["nan-lr", "minus-inf-grad-norm", "duplicate-key", "1e308-bucket"],
)
def test_a_number_or_key_tuner_cannot_take_as_given_is_one_line(
    flag: str,
    content: str,
    says: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "file.json").write_text(content)
    line = _in_process(["doctor", flag, str(tmp_path / "file.json")], monkeypatch, capsys)
    assert says in line, line


# -- §4, §6: the FSDP2 import: every value's type checked before it is looked up, versions integers, keys folded as
# transformers folds them -------------------------------------------------------------------------------------------
ACC_WRAP = "  fsdp_auto_wrap_policy: SIZE_BASED_WRAP\n"


@pytest.mark.parametrize(
    ("accelerate", "args", "says"),
    [
        (ACCELERATE.replace("fsdp_version: 2", "fsdp_version: .inf"), {}, "fsdp_version is inf, not a finite number"),
        (ACCELERATE.replace("mixed_precision: bf16", "mixed_precision: [bf16]"), {}, "mixed_precision ['bf16']"),
        (ACCELERATE.replace("fsdp_version: 2", "fsdp_version: 2.9"), {}, "fsdp_config.fsdp_version is 2.9"),
        (ACCELERATE.replace("fsdp_version: 2", "fsdp_version: !!binary Mg=="), {}, "fsdp_version is b'2'"),
        (
            ACCELERATE.replace("  fsdp_auto_wrap_policy: NO_WRAP\n", ACC_WRAP + "  fsdp_min_num_params: 1e308\n"),
            {},
            "fsdp_min_num_params must be a whole number of parameters >= 0 (at most 2^53)",
        ),
        (None, {"fsdp": [["full_shard"]]}, "each item is one of transformers' option strings"),
        (None, {"fsdp": [{"a": 1}]}, "each item is one of transformers' option strings"),
        (None, {"fsdp": True, "fsdp_config": {"fsdp_version": 1, "version": 2}}, "fsdp_config.version is 1"),
        (None, {"fsdp": True, "fsdp_config": {"version": 2.5}}, "fsdp_config.version is 2.5"),
    ],
    ids=[
        *("version-inf", "mixed-list", "version-2.9", "version-binary", "min-params-1e308"),
        *("fsdp-nested-list", "fsdp-list-of-dicts", "prefixed-key-wins", "version-2.5"),
    ],
)
def test_an_fsdp2_value_tuner_would_misread_is_one_line(
    accelerate: str | None,
    args: dict[str, Any],
    says: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Before: a traceback (int(inf), an unhashable list) or a silent misread (2.9 and b"2" read as 2, version 2 where
    transformers runs fsdp_version 1, 1e308 stored)."""
    if accelerate is None:
        (tmp_path / "args.json").write_text(json.dumps({**ARGS, **args}))
        argv = ["search", "--budget", "1m", "--storage", f"sqlite:///{tmp_path}/t.db", "--baseline"]
        line = _in_process([*argv, str(tmp_path / "args.json")], monkeypatch, capsys)
    else:
        line = _in_process(_write_accelerate(tmp_path, accelerate), monkeypatch, capsys)
    assert says in line, line


def _write_accelerate(tmp_path: Path, text: str) -> list[str]:
    (tmp_path / "acc.yaml").write_text(text)
    (tmp_path / "args.json").write_text(json.dumps(ARGS))
    files = ["--baseline", f"{tmp_path}/acc.yaml", "--training-args", f"{tmp_path}/args.json"]
    return ["search", "--budget", "1m", "--storage", f"sqlite:///{tmp_path}/t.db", *files]


def test_both_spellings_of_an_fsdp_key_are_read_as_transformers_reads_them(tmp_path: Path) -> None:
    from tuner.interop.baseline_fsdp import trainer_fsdp

    found = trainer_fsdp({"fsdp": True, "fsdp_config": {"cpu_offload": False, "fsdp_cpu_offload": True}})
    assert found is not None and found.knobs["offload_params"] is True
    assert any("transformers keeps fsdp_cpu_offload's" in note for note in found.notes), found.notes
