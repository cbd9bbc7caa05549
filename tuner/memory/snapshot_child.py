"""CUDA memory snapshots read in child processes (issue 33 §2, §5; issue 42 §8): whatever a pickle does to its
reader, tuner goes on with one line.

The C unpickler hashes what it builds (a 1,000,000-deep tuple as a dict key overflows the C stack: SIGSEGV; 200,000
colliding int keys cost minutes), and a small pickle can ask for much memory or time; no check in Python can come
before that hashing. Each child (``python -m tuner.memory.snapshot_child PATH MAX_BYTES``, run in the folder that holds
the ``tuner`` package: no folder of the user's on its import path) limits its own address space (``memory_limit``,
within the host's own limit: a batch job's lower ``ulimit -v`` lowers it, and a snapshot stopped by it says so) and
prints one JSON line, the snapshot's parts or the one-line error. A signal, a timeout or anything else is one line
here.

``read_all`` reads the snapshots of one explain (a failed trial's ranks) in parallel children under one time budget,
``TIMEOUT_S`` for all of them (one after another, 8 hostile ranks took 16 minutes): a child still running when it
runs out is stopped, a snapshot not yet started is not read, and each says so."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path
from typing import IO

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

TIMEOUT_S = 120  # all the snapshots of one explain (a 256 MiB snapshot torch wrote reads in well under a minute)
WORKERS = 4  # children at once at most (each may take its memory limit)
BASE_MEMORY = 1 << 30  # the interpreter and the unpickler's own
_POLL_S = 0.05


def memory_limit(max_bytes: int) -> int:
    """The child's address space: an unpickled snapshot takes a few times its file's size; never above the limit
    this process runs under (a child cannot raise its own hard limit)."""
    wanted = BASE_MEMORY + 16 * max_bytes
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    return wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)


def _memory_line(max_bytes: int) -> str:
    limit = memory_limit(max_bytes)
    if limit < BASE_MEMORY + 16 * max_bytes:
        return (
            f"reading it needs more than the {limit >> 20:,} MiB of memory this host allows a process (ulimit -v); "
            "raise that limit, or explain on a host without it"
        )
    return f"unpickling it needs more than {limit >> 20:,} MiB; not a snapshot torch wrote"


def _parts_of(data: dict[str, object]) -> SnapshotParts:
    sites = data.pop("unattributed_sites")
    parts = data.pop("parts")
    assert isinstance(sites, list) and isinstance(parts, list)
    return SnapshotParts(
        parts=tuple((str(name), int(n)) for name, n in parts),
        unattributed_sites=tuple(CallSite(**site) for site in sites),
        **data,  # type: ignore[arg-type]
    )


def _start(path: str, max_bytes: int, files: ExitStack) -> tuple[subprocess.Popen[bytes], IO[bytes], IO[bytes]]:
    """The child reading ``path``, its output and errors going to temporary files (a pipe could fill and stall it)
    that ``files`` closes."""
    cmd = [sys.executable, "-m", "tuner.memory.snapshot_child", os.path.abspath(path), str(max_bytes)]
    home = Path(tuner.__file__).resolve().parent.parent  # `-m` puts its folder first on the import path
    out = files.enter_context(tempfile.TemporaryFile())  # noqa: SIM115  (closed by ``files``)
    err = files.enter_context(tempfile.TemporaryFile())  # noqa: SIM115
    child = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd=home)
    return child, out, err


def _finished(path: str, returncode: int, out: IO[bytes], err: IO[bytes], max_bytes: int) -> SnapshotRead:
    """What a child that exited said: the parts, else its one-line error, else why it died."""
    out.seek(0)
    err.seek(0)
    stdout, stderr = out.read(1 << 20), err.read(1 << 16)
    if returncode < 0:
        name = signal.Signals(-returncode).name if -returncode in signal.valid_signals() else "a signal"
        return SnapshotRead(path, error=f"its reader was killed by {name}; not a snapshot torch wrote")
    try:
        answer = json.loads(stdout.decode("utf-8", "replace").strip().splitlines()[-1])
    except (ValueError, IndexError):
        if b"MemoryError" in stderr:  # the interpreter itself could not start under the host's limit
            return SnapshotRead(path, error=_memory_line(max_bytes))
        return SnapshotRead(path, error=f"its reader stopped (exit {returncode}); not a snapshot torch wrote")
    if answer.get("error") is not None:
        return SnapshotRead(path, error=str(answer["error"]))
    return SnapshotRead(path, parts=_parts_of(answer["parts"]))


def _checked(path: str, max_bytes: int) -> SnapshotRead | None:
    """Why ``path`` is not read at all (gone, not a regular file, too large), else None."""
    try:
        size = regular_size(path)
        if size > max_bytes:
            raise SnapshotError(f"{size / (1 << 20):,.0f} MiB, over the {max_bytes >> 20} MiB read at most")
    except FileNotFoundError:
        return SnapshotRead(path, error="the file is gone (the latest 20 are kept beside the study's database)")
    except OSError as exc:
        return SnapshotRead(path, error=f"cannot be read ({exc.strerror or type(exc).__name__})")
    except SnapshotError as exc:
        return SnapshotRead(path, error=str(exc))
    return None


class _Reads:
    """The children of one ``read_all``: started ``workers`` at a time, each read kept by its index."""

    def __init__(self, paths: Sequence[str], max_bytes: int, workers: int, files: ExitStack) -> None:
        self.paths, self.max_bytes, self.workers, self.files = paths, max_bytes, workers, files
        self.done: dict[int, SnapshotRead] = {}
        self.waiting = list(range(len(paths)))
        self.running: dict[int, tuple[subprocess.Popen[bytes], IO[bytes], IO[bytes]]] = {}

    def start_more(self) -> None:
        while self.waiting and len(self.running) < self.workers:
            index = self.waiting.pop(0)
            found = _checked(self.paths[index], self.max_bytes)
            if found is None:
                self.running[index] = _start(self.paths[index], self.max_bytes, self.files)
            else:
                self.done[index] = found

    def collect(self) -> None:
        for index, (child, out, err) in list(self.running.items()):
            if child.poll() is not None:
                self.done[index] = _finished(self.paths[index], child.returncode, out, err, self.max_bytes)
                del self.running[index]

    def stop(self, budget_s: float) -> None:
        """The children still running killed, and they and the snapshots not started said as such."""
        shared = f" (the {len(self.paths)} snapshots of this explain share it)" if len(self.paths) > 1 else ""
        for index, (child, _, _) in self.running.items():
            child.kill()
            child.wait()
            said = f"reading it took over {budget_s:g} s{shared}; stopped, not a snapshot torch wrote"
            self.done[index] = SnapshotRead(self.paths[index], error=said)
        for index in self.waiting:
            said = f"not read: the {budget_s:g} s for this explain's {len(self.paths)} snapshots ran out before it"
            self.done[index] = SnapshotRead(self.paths[index], error=said)


def read_all(
    paths: Sequence[str], max_bytes: int = MAX_FILE_BYTES, budget_s: float = TIMEOUT_S, workers: int = WORKERS
) -> tuple[SnapshotRead, ...]:
    """The snapshots at ``paths`` read and attributed in child processes, ``workers`` at a time, all within
    ``budget_s`` seconds; each, in order, its parts or why not in one line (the explanation goes on without)."""
    deadline = time.monotonic() + budget_s
    with ExitStack() as files:
        reads = _Reads(paths, max_bytes, workers, files)
        try:
            while time.monotonic() < deadline:
                reads.start_more()
                reads.collect()
                if not reads.waiting and not reads.running:
                    break
                time.sleep(_POLL_S)
        finally:
            reads.stop(budget_s)
    return tuple(reads.done[i] for i in range(len(paths)))


def _answer(path: str, max_bytes: int) -> dict[str, object]:
    try:
        return {"parts": asdict(parse_file(path, max_bytes))}
    except SnapshotError as exc:
        return {"error": str(exc)}
    except MemoryError:
        return {"error": _memory_line(max_bytes)}
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
    return read_all([path], max_bytes)[0]


if __name__ == "__main__":
    main(sys.argv[1:])
