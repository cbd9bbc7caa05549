"""A CUDA memory snapshot read in a child process (issue 33 §2, §5): whatever the pickle does to its reader, tuner
goes on with one line.

The C unpickler hashes what it builds (a 1,000,000-deep tuple as a dict key overflows the C stack: SIGSEGV), and a
small pickle can ask for much memory or time; no check in Python can come before that hashing. The child
(``python -m tuner.memory.snapshot_child PATH MAX_BYTES``, run in the folder that holds the ``tuner`` package:
no folder of the user's on its import path) limits
its own address space (``memory_limit``) and is killed after ``TIMEOUT_S``; it prints one JSON line, the
snapshot's parts or the one-line error. A signal, a timeout or anything else is one line here."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import tuner
from tuner.memory.snapshot_parts import (
    MAX_FILE_BYTES,
    CallSite,
    SnapshotError,
    SnapshotParts,
    SnapshotRead,
    parse_file,
    regular_size,
)

TIMEOUT_S = 120  # a 256 MiB snapshot torch wrote reads in well under a minute
BASE_MEMORY = 1 << 30  # the interpreter and the unpickler's own


def memory_limit(max_bytes: int) -> int:
    """The child's address space: an unpickled snapshot takes a few times its file's size."""
    return BASE_MEMORY + 16 * max_bytes


def _parts_of(data: dict[str, object]) -> SnapshotParts:
    sites = data.pop("unattributed_sites")
    parts = data.pop("parts")
    assert isinstance(sites, list) and isinstance(parts, list)
    return SnapshotParts(
        parts=tuple((str(name), int(n)) for name, n in parts),
        unattributed_sites=tuple(CallSite(**site) for site in sites),
        **data,  # type: ignore[arg-type]
    )


def read_in_child(path: str, max_bytes: int) -> SnapshotRead:
    """The snapshot at ``path`` read by the child; the child's death, a timeout or its error as one line."""
    cmd = [sys.executable, "-m", "tuner.memory.snapshot_child", os.path.abspath(path), str(max_bytes)]
    home = Path(tuner.__file__).resolve().parent.parent  # `-m` puts its folder first on the import path
    try:
        done = subprocess.run(
            cmd, capture_output=True, timeout=TIMEOUT_S, check=False, stdin=subprocess.DEVNULL, cwd=home
        )
    except subprocess.TimeoutExpired:
        return SnapshotRead(path, error=f"reading it took over {TIMEOUT_S} s (stopped); not a snapshot torch wrote")
    if done.returncode < 0:
        name = signal.Signals(-done.returncode).name if -done.returncode in signal.valid_signals() else "a signal"
        return SnapshotRead(path, error=f"its reader was killed by {name}; not a snapshot torch wrote")
    try:
        answer = json.loads(done.stdout.decode("utf-8", "replace").strip().splitlines()[-1])
    except (ValueError, IndexError):
        return SnapshotRead(path, error=f"its reader stopped (exit {done.returncode}); not a snapshot torch wrote")
    if answer.get("error") is not None:
        return SnapshotRead(path, error=str(answer["error"]))
    return SnapshotRead(path, parts=_parts_of(answer["parts"]))


def _answer(path: str, max_bytes: int) -> dict[str, object]:
    try:
        return {"parts": asdict(parse_file(path, max_bytes))}
    except SnapshotError as exc:
        return {"error": str(exc)}
    except MemoryError:
        return {"error": f"unpickling it needs more than {memory_limit(max_bytes) >> 20:,} MiB; not a snapshot"}
    except RecursionError:
        return {"error": "not a torch memory snapshot (it nests too deep to read)"}
    except OSError as exc:
        return {"error": f"cannot be read ({exc.strerror or type(exc).__name__})"}


def main(argv: list[str]) -> None:
    path, max_bytes = argv[0], int(argv[1])
    limit = memory_limit(max_bytes)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    print(json.dumps(_answer(path, max_bytes)))


def read(path: str, max_bytes: int = MAX_FILE_BYTES) -> SnapshotRead:
    """The snapshot at ``path`` read and attributed in a child process, else why not, in one line (the explanation
    goes on without)."""
    try:
        size = regular_size(path)
        if size > max_bytes:
            raise SnapshotError(f"{size / (1 << 20):,.0f} MiB, over the {max_bytes >> 20} MiB read at most")
        return read_in_child(path, max_bytes)
    except FileNotFoundError:
        return SnapshotRead(path, error="the file is gone (the latest 20 are kept beside the study's database)")
    except OSError as exc:
        return SnapshotRead(path, error=f"cannot be read ({exc.strerror or type(exc).__name__})")
    except SnapshotError as exc:
        return SnapshotRead(path, error=str(exc))


if __name__ == "__main__":
    main(sys.argv[1:])
