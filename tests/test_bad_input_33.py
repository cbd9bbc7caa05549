"""Bad input, issue 33 ("untrusted files in, nothing runs, nothing hangs"): a user's tokenizer and model folders,
data files, OOM texts and CUDA memory snapshots, each small, generated and hostile. Every case failed before its fix
(code imported on "y", a segfault, hours of CPU, a traceback, raw escapes, another dataset's lengths, a request to
the network); each is now one line and exit 2, or one line in place of the part it spoils.

A case that segfaulted before runs the real `tuner` in a subprocess (a crash must not take pytest with it); the
others run the entry point in-process, as tests/test_bad_input.py does."""

from __future__ import annotations

import io
import json
import os
import pickle
import re
import socket
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.seq2seq_data import save_tokenizer, write_jsonl
from tests.test_bad_input import _one_error_line
from tuner.cli import main as tuner_main

TUNER = [sys.executable, "-c", "from tuner.cli import main; main()"]
MiB = 1 << 20


def _tuner(env: dict[str, str], *args: str, stdin: str = "", timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([*TUNER, *args], capture_output=True, text=True, env=env, input=stdin, timeout=timeout)


def _one_line(out: subprocess.CompletedProcess) -> str:
    assert out.returncode == 2, (out.returncode, out.stdout[-2000:], out.stderr[-2000:])
    return _one_error_line(out.stderr)


def _in_process(argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> str:
    monkeypatch.setenv("COLUMNS", "400")
    monkeypatch.setattr(sys, "argv", ["tuner", *argv])
    with pytest.raises(SystemExit) as exit_info:
        tuner_main()
    line = _one_error_line(capsys.readouterr().err)
    assert exit_info.value.code == 2, line
    return line


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("bad33")
    tok = save_tokenizer(root / "tok")
    data = write_jsonl(root / "data.jsonl", __import__("numpy").array([3, 5, 8]))
    env = {**os.environ, "TUNER_CACHE_DIR": str(root / "cache"), "COLUMNS": "400"}
    return {"root": root, "tok": tok, "data": data, "env": env}


def _lengths(world: dict[str, Any], dataset: Path | str, tokenizer: Path | str | None = None) -> list[str]:
    return [
        "lengths",
        "--dataset",
        str(dataset),
        "--tokenizer",
        str(tokenizer or world["tok"]),
        "--input-column",
        "source",
        "--target-column",
        "target",
        "--no-progress",
    ]


# -- §1: no code from a tokenizer's or a model's folder, never a prompt ----------------------------------------------
def _wants_code(folder: Path, file: str, entry: dict[str, Any], module: str, marker: Path) -> Path:
    """A folder whose config asks transformers to import its own module, which leaves ``marker`` when imported."""
    folder.mkdir()
    (folder / file).write_text(json.dumps(entry))
    (folder / f"{module}.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n")
    return folder


def test_a_tokenizer_folders_code_never_runs(world: dict[str, Any], tmp_path: Path) -> None:
    marker = tmp_path / "RAN"
    entry = {"auto_map": {"AutoTokenizer": ["evil_tok.EvilTokenizer", None]}, "tokenizer_class": "EvilTokenizer"}
    folder = _wants_code(tmp_path / "tok", "tokenizer_config.json", entry, "evil_tok", marker)
    out = _tuner(world["env"], *_lengths(world, world["data"], folder), stdin="y\n")
    line = _one_line(out)
    assert "wants its own code run (tokenizer_config.json auto_map" in line and "tuner --trust-remote-code" in line
    assert "[y/N]" not in out.stdout + out.stderr and not marker.exists()
    # asked for with the flag, the folder's module runs (here it defines no tokenizer: that is one line too)
    asked = _tuner(world["env"], "--trust-remote-code", *_lengths(world, world["data"], folder), stdin="")
    assert marker.exists() and "[y/N]" not in asked.stdout + asked.stderr
    assert asked.returncode == 2 and "Traceback" not in asked.stderr


def test_a_model_folders_code_never_runs(world: dict[str, Any], tmp_path: Path) -> None:
    marker = tmp_path / "RAN"
    entry = {"model_type": "evil", "auto_map": {"AutoConfig": "evil_cfg.EvilConfig"}}
    folder = _wants_code(tmp_path / "model", "config.json", entry, "evil_cfg", marker)
    argv = ["estimate", "--model", str(folder), "--micro-batch-size", "1", "--max-length", "8"]
    out = _tuner(world["env"], *argv, stdin="y\n")
    line = _one_line(out)
    assert re.search(r"model directory .* wants its own code run \(config\.json auto_map", line), line
    assert "[y/N]" not in out.stdout + out.stderr and not marker.exists()


def test_trials_models_never_runs_a_folders_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe's own loader (a hub id's cached folder reaches it without tuner's check): refused, no prompt."""
    from trials.contract import ModelSpec
    from trials.models import load_config

    marker = tmp_path / "RAN"
    entry = {"model_type": "evil", "auto_map": {"AutoConfig": "evil_cfg.EvilConfig"}}
    folder = _wants_code(tmp_path / "model", "config.json", entry, "evil_cfg", marker)
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))
    monkeypatch.delenv("TUNER_TRUST_REMOTE_CODE", raising=False)
    with pytest.raises(ValueError, match="trust_remote_code"):
        load_config(ModelSpec(source=str(folder)))
    assert not marker.exists()
    monkeypatch.setenv("TUNER_TRUST_REMOTE_CODE", "1")  # what `tuner --trust-remote-code` gives every probe
    with pytest.raises(Exception):  # noqa: B017  (the module defines no EvilConfig: transformers' own error)
        load_config(ModelSpec(source=str(folder)))
    assert marker.exists()  # the consent reached the probe's loader: the folder's module was imported


# -- §3: JSON lines that crash pyarrow are refused before it reads them ----------------------------------------------
@pytest.mark.parametrize(
    ("line", "says"),
    [
        ('{"source": "w1", "target": "w2", "junk": ' + "[" * 20_000 + "]" * 20_000 + "}\n", "nests deeper than 64"),
        ('{"source": "w1", "target": "w2", "junk": "' + "x" * (5 * MiB) + '"}\n', "longer than 4 MiB"),
    ],
    ids=["deep-20000", "line-5MiB"],
)
def test_a_json_lines_file_that_crashes_pyarrow_is_one_line(
    line: str, says: str, world: dict[str, Any], tmp_path: Path
) -> None:
    data = tmp_path / "hostile.jsonl"
    data.write_text('{"source": "w1 w2", "target": "w3"}\n' + line)
    got = _one_line(_tuner(world["env"], *_lengths(world, data)))
    assert says in got and "hostile.jsonl" in got and "line 2" in got, got


# -- §7: a saved dataset's state.json that is not an object is one line ------------------------------------------------
@pytest.mark.parametrize(
    ("state", "says"),
    [(b"{not json", "is not valid JSON"), (b"[1, 2]", "is not a JSON object"), (b"\xff\xfe{}", "is not UTF-8")],
    ids=["not-json", "a-list", "not-utf8"],
)
def test_a_saved_datasets_broken_state_is_one_line(
    state: bytes,
    says: str,
    world: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "state.json").write_bytes(state)
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    line = _in_process(_lengths(world, saved), monkeypatch, capsys)
    assert "saved dataset state" in line and says in line, line


def test_a_json_integer_of_5000_digits_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    baseline = tmp_path / "ds.json"
    baseline.write_text('{"train_micro_batch_size_per_gpu": ' + "9" * 5000 + "}")
    monkeypatch.chdir(tmp_path)
    line = _in_process(["doctor", "--ds-config", str(baseline)], monkeypatch, capsys)
    assert "holds a number too long to read" in line, line


# -- §8: the cache is keyed by what was read; data files outside the folder are refused --------------------------------
def _lengths_out(argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> str:
    monkeypatch.setenv("COLUMNS", "400")
    monkeypatch.setattr(sys, "argv", ["tuner", *argv])
    tuner_main()
    return capsys.readouterr().out


def test_two_saved_datasets_of_one_fingerprint_get_their_own_lengths(
    world: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import datasets

    short = tmp_path / "short"
    long = tmp_path / "long"
    datasets.Dataset.from_dict({"source": ["w1 w2"], "target": ["w3"]}).save_to_disk(str(short))
    datasets.Dataset.from_dict({"source": [" ".join(["w1"] * 500)], "target": ["w3"]}).save_to_disk(str(long))
    state = json.loads((long / "state.json").read_text())
    state["_fingerprint"] = json.loads((short / "state.json").read_text())["_fingerprint"]
    (long / "state.json").write_text(json.dumps(state))
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    first = _lengths_out(_lengths(world, short), monkeypatch, capsys)
    second = _lengths_out(_lengths(world, long), monkeypatch, capsys)
    assert first.splitlines()[2].split()[6] == "3", first  # "w1 w2" + </s>
    assert "(cached)" not in second.splitlines()[0] and second.splitlines()[2].split()[6] == "501", second


def test_a_data_folder_naming_files_outside_it_is_one_line(
    world: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", __import__("numpy").array([3]))
    write_jsonl(tmp_path / "elsewhere.jsonl", __import__("numpy").array([30]))
    (folder / "README.md").write_text(
        "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n    path: ../elsewhere.jsonl\n---\n"
    )
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    line = _in_process(_lengths(world, folder), monkeypatch, capsys)
    assert "names a data file outside it" in line and "elsewhere.jsonl" in line, line


# -- §9: reading local data asks the network nothing -------------------------------------------------------------------
def test_reading_local_data_makes_no_network_request(
    world: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """As a user's default environment has it (no HF_HUB_OFFLINE): every name lookup and connection is recorded."""
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_UPDATE_DOWNLOAD_COUNTS", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    asked: list[object] = []

    def refuse(*args: object, **kwargs: object) -> Any:
        asked.append(args[:2])
        raise OSError("no network in this test")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    data = write_jsonl(tmp_path / "fresh.jsonl", __import__("numpy").array([4, 6]))
    out = _lengths_out(_lengths(world, data), monkeypatch, capsys)
    assert out.startswith("2 samples of"), out
    assert asked == []
    line = _in_process(_lengths(world, data, "nobody-here/no-such-tokenizer"), monkeypatch, capsys)  # a hub id
    assert "cannot be loaded offline" in line, line
    assert asked == []


# -- §4, §5, §7: the OOM text ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("@/dev/zero", "is not a regular file"),
        ("@{fifo}", "is not a regular file"),
        ("@{big}", "is over 64 KiB"),
        ("Tried to allocate 1 GiB " + "1" * 100_000, "the text is over 64 KiB"),
        ("Tried to allocate 1" + "0" * 309 + " GiB", "no 'Tried to allocate <size>'"),
    ],
    ids=["dev-zero", "fifo", "1MiB-file", "100k-digits", "1e309-GiB"],
)
def test_a_hostile_oom_message_is_one_line(
    text: str, says: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "big.txt").write_text("Tried to allocate 1.00 GiB. " * 40_000)
    text = text.replace("{fifo}", str(tmp_path / "fifo")).replace("{big}", str(tmp_path / "big.txt"))
    argv = ["explain", "--model", "builtin:tiny-t5", "--device-memory", "40MiB"]
    line = _in_process([*argv, "--oom-message", text], monkeypatch, capsys)
    assert says in line and len(line) < 400, line


@pytest.mark.timeout(60)  # ~190 s before: [0-9]+ retried from each digit of the run
def test_an_oom_message_with_a_long_digit_run_is_read_in_linear_time() -> None:
    from tuner.memory.oom_message import parse

    got = parse("Tried to allocate 1.50 GiB " + "1" * 60_000 + " GPU 0 has a total capacity of 79.15 GiB")
    assert got.failed == int(1.5 * (1 << 30)) and got.capacity == int(79.15 * (1 << 30))


# -- §10: a 422 names the first invalid fields and counts the rest -----------------------------------------------------
def test_a_body_of_30000_bad_items_gets_a_small_422(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from api.app import create_app
    from tuner.settings import Settings

    client = TestClient(create_app(Settings(storage=f"sqlite:///{tmp_path}/t.db", api_token="t")))
    body = {"name": "bad", "sample_lengths": [["x", "y"]] * 9_000 + ["z"] * 3_000}
    resp = client.post("/studies", json=body, headers={"Authorization": "Bearer t"})
    assert resp.status_code == 422, resp.text[:500]
    assert len(resp.content) < 20_000, len(resp.content)
    detail = resp.json()["detail"]
    assert re.search(r"and [\d,]+ more invalid fields$", detail) and "\n" not in detail, detail[-300:]


# -- §2, §4, §5, §6, §7: CUDA memory snapshots a trial names -----------------------------------------------------------
_DEEP = "@@DEEP@@"


def _deep_tuple(levels: int) -> bytes:
    return b")" + b"\x85" * levels  # EMPTY_TUPLE, then TUPLE1 around it `levels` times


def _with_deep(snapshot: dict[str, Any], levels: int) -> bytes:
    """``snapshot`` pickled (protocol 2: no frames) with the string _DEEP replaced by a tuple ``levels`` deep."""
    data = pickle.dumps(snapshot, protocol=2)
    placeholder = b"X" + struct.pack("<I", len(_DEEP)) + _DEEP.encode()
    assert data.count(placeholder) == 1
    return data.replace(placeholder, _deep_tuple(levels))


def _hostile_snapshots(tmp: Path) -> dict[str, tuple[Path, str]]:
    """name -> (the file, what its one line says)."""
    from tests.tuner.memory.test_snapshot_parts import block, frame, snapshot

    files: dict[str, tuple[bytes | None, str]] = {
        "deep-filename-1e6": (_with_deep(snapshot(block(MiB, [frame(_DEEP, "f")])), 1_000_000), "filename is tuple"),
        "deep-filename-1e5": (_with_deep(snapshot(block(MiB, [frame(_DEEP, "f")])), 100_000), "filename is tuple"),
        "deep-key-1e6": (_with_deep(snapshot(block(MiB, [{_DEEP: 1}])), 1_000_000), "killed by SIGSEGV"),
        "shared-frames": (None, ""),
        "long-frame": (
            pickle.dumps(
                snapshot(*(block(MiB, [frame("deepspeed/runtime/zero/" * 1000 + str(k), "f")]) for k in range(30)))
            ),
            "",
        ),
        "huge-size": (pickle.dumps(snapshot(block(10**400, []))), "a block of about 2^1329 bytes"),
        "module-name": (b"\x80\x02c" + b"os\x1b[2J" + b"x" * MiB + b"\nsystem\n.", r"refused: it names os\x1b[2Jxxx"),
    }
    frames = [frame("/w/jobs/loss.py", "smooth")] * 1_000_000  # one list, a million references to one frame
    shared = block(MiB, frames)
    many = snapshot(shared)
    many["segments"][0]["blocks"] = [shared] * 200_000
    files["shared-frames"] = (pickle.dumps(many), "")
    out = {}
    for name, (data, says) in files.items():
        path = tmp / f"{name}.pickle"
        assert data is not None
        path.write_bytes(data)
        out[name] = (path, says)
    os.mkfifo(tmp / "fifo.pickle")
    out["fifo"] = (tmp / "fifo.pickle", "not a regular file")
    out["dev-zero"] = (Path("/dev/zero"), "not a regular file")
    return out


def _study(url: str, snapshots: list[str]) -> None:
    from tests.helpers.sample_storage import SampleStudy
    from trials.contract import FailedAllocation, Knobs, ProbeConfig, ProbeResult, RankMemory

    sample = SampleStudy(url, "s", {"model": {"source": "builtin:tiny-t5"}, "world_size": 1, "device_memory": 64 * MiB})
    config = ProbeConfig(knobs=Knobs(micro_batch_size=2, max_length=64, engine="torch"), device_memory=64 * MiB)
    failed = FailedAllocation(nbytes=8 * MiB, live=60 * MiB, capacity=64 * MiB, phase="train", stage="backward")
    ranks = [
        RankMemory(rank=k, oom_need=68 * MiB, failed_allocation=failed, snapshot=s) for k, s in enumerate(snapshots)
    ]
    sample.probe(
        config,
        ProbeResult(status="oom", cause="OutOfMemoryError", ranks=ranks),
        trial_number=0,
        config_key="a",
        fidelity="baseline",
    )


@pytest.mark.slow
def test_hostile_snapshots_are_each_one_line_and_the_rest_is_explained(world: dict[str, Any], tmp_path: Path) -> None:
    """`tuner explain --study S --trial 0 --json` of a trial whose ranks name hostile snapshots (one trace): each
    is one line in place of its parts (a crash of the child reading it, not of tuner), the shared stack is read
    once, a long frame is cut before any pattern runs."""
    hostile = _hostile_snapshots(tmp_path)
    url = f"sqlite:///{tmp_path}/t.db"
    _study(url, [str(path) for path, _ in hostile.values()])
    out = _tuner(world["env"], "explain", "--storage", url, "--study", "s", "--trial", "0", "--json", timeout=400)
    assert out.returncode == 0, out.stderr[-3000:]
    reads = {f["snapshot"]: f["snapshot_parts"] for f in json.loads(out.stdout)["trial"]["failures"]}
    for name, (path, says) in hostile.items():
        got = reads[str(path)]
        if says:
            assert got["attributed"] is None and says in got["error"] and len(got["error"]) < 300, (name, got)
        else:
            assert got["error"] is None, (name, got)
    shared = reads[str(hostile["shared-frames"][0])]["attributed"]
    assert shared["blocks"] == 200_000 and shared["unattributed"] == 200_000 * MiB
    long = reads[str(hostile["long-frame"][0])]["attributed"]
    assert long["unattributed"] == 30 * MiB and len(long["unattributed_sites"][0]["frame"]) < 300


@pytest.mark.slow
def test_a_snapshots_escapes_never_reach_the_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.tuner.memory.test_snapshot_parts import block, frame, snapshot

    path = tmp_path / "esc\x1b]0;title\x07.pickle"
    path.write_bytes(pickle.dumps(snapshot(block(MiB, [frame("/w/\x1b[2Jclear.py", "\x1b[8mhidden")]))))
    url = f"sqlite:///{tmp_path}/t.db"
    _study(url, [str(path)])
    monkeypatch.setenv("COLUMNS", "400")
    monkeypatch.setattr(sys, "argv", ["tuner", "explain", "--storage", url, "--study", "s", "--trial", "0"])
    tuner_main()
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "esc?]0;title" in out and "?[2Jclear.py:1:?[8mhidden" in out, out
