"""On CUDA, what an out-of-memory leaves behind: a memory snapshot (pytorch.org/memory_viz reads it) and the refused
allocation, taken by an out-of-memory observer before the stack unwinds (the tensors the failing step held are still
alive then).

The decisions are small pure functions (tested on CPU): whether to record (``wanted``), how much history
(``HISTORY_ENTRIES``), where the file goes (``snapshot_path``), whether a written file is kept (``kept``) and what the
observer's arguments mean (``failed_from_observer``). ``OomSnapshot`` is the edge: torch.cuda's
``_record_memory_history`` over the probe's memory window and the observer that dumps the snapshot."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from trials.contract import FailedAllocation

#: the allocator events kept (a ring: the latest ones, those before the failure); each pickles to a few hundred bytes
#: with its Python stack, so the file stays in the tens of MiB
HISTORY_ENTRIES = 20_000
#: a snapshot file larger than this is deleted (the row keeps the failed allocation, and why there is no file)
MAX_SNAPSHOT_BYTES = 256 << 20
#: "0" turns the snapshot off (recording stacks slows the memory window's allocations a little)
SNAPSHOT_ENV = "TUNER_OOM_SNAPSHOT"


def wanted(device_type: str, env: Mapping[str, str], has_api: bool) -> bool:
    """Record a snapshot: on a CUDA device, where this torch has the observer API, unless SNAPSHOT_ENV is "0"."""
    return device_type == "cuda" and has_api and env.get(SNAPSHOT_ENV, "1") != "0"


def snapshot_path(result: Path) -> Path:
    """Beside the rank's result file: ``result.rank1.json`` -> ``result.rank1.snapshot.pickle``."""
    return result.with_name(f"{result.stem}.snapshot.pickle")


def kept(nbytes: int, limit: int = MAX_SNAPSHOT_BYTES) -> bool:
    """Whether a written snapshot of ``nbytes`` is kept (bounded size: a larger one is deleted)."""
    return 0 < nbytes <= limit


def failed_from_observer(alloc: int, allocated: int | None, capacity: int | None) -> FailedAllocation:
    """The refused allocation from the observer's ``alloc`` (bytes asked for, rounded up by the allocator) and what
    this rank had allocated then (torch.cuda.memory_allocated, None when it could not be read); the op and shape are
    in the snapshot's stack frames, not here."""
    return FailedAllocation(nbytes=max(0, int(alloc)), live=max(0, int(allocated or 0)), capacity=capacity)


def _api() -> tuple[Callable[..., Any], Callable[..., Any]] | None:
    """torch's observer attach and history recorder, where this torch has them (names moved between versions)."""
    import torch

    attach = getattr(torch.cuda.memory, "_attach_out_of_memory_observer", None) or getattr(
        torch._C, "_cuda_attach_out_of_memory_observer", None
    )
    record = getattr(torch.cuda.memory, "_record_memory_history", None)
    return (attach, record) if attach is not None and record is not None else None


class OomSnapshot:
    """Over the memory window (a context manager): allocator history recorded; at an OOM the observer writes the
    snapshot to ``path`` (``written`` once kept, :func:`kept`) and the refused allocation to ``failed``. The
    observer stays attached for the process (torch has no detach): it acts only inside the window."""

    def __init__(self, device: Any, path: Path, capacity: int | None) -> None:
        self.device = device
        self.path = path
        self.capacity = capacity
        self.failed: FailedAllocation | None = None
        self.written: Path | None = None
        self._active = False
        self._api = _api()

    @property
    def enabled(self) -> bool:
        return wanted(self.device.type, os.environ, self._api is not None)

    def __enter__(self) -> OomSnapshot:
        if not self.enabled or self._api is None:
            return self
        attach, record = self._api
        record("all", context="all", stacks="python", max_entries=HISTORY_ENTRIES, device=self.device)
        attach(self._observe)
        self._active = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._active and self._api is not None:
            self._active = False
            with contextlib.suppress(Exception):
                self._api[1](None, device=self.device)

    def _observe(self, device: int, alloc: int, _device_total: int, _device_free: int) -> None:
        """Called by the caching allocator when an allocation fails, before the exception is raised."""
        if not self._active:
            return
        import torch

        allocated = None
        with contextlib.suppress(Exception):
            allocated = int(torch.cuda.memory_allocated(device))
        self.failed = failed_from_observer(alloc, allocated, self.capacity)
        try:
            torch.cuda.memory._dump_snapshot(str(self.path))
            size = self.path.stat().st_size
        except Exception:  # the dump itself may need host memory; the failed allocation is kept regardless
            return
        if kept(size):
            self.written = self.path
        else:
            self.path.unlink(missing_ok=True)
