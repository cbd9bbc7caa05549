"""Device memory: an exact live-tensor tracker (the emulated device on CPU, also usable under FakeTensorMode), the CUDA
budget and peaks, and the OOM predicate.

On CPU the probe emulates a device of ``capacity`` bytes: every new tensor storage adds its ``nbytes`` to the live
total, a ``weakref.finalize`` on the storage subtracts it when freed, and a storage that would take the live total past
the capacity raises ``torch.OutOfMemoryError`` — the analogue of CUDA's ``memory_allocated`` and of its allocator
failing, deterministic to the byte. Views share their base's storage and are counted once. RLIMIT_DATA above the
post-import baseline stays as the real backstop (torch's "can't allocate memory" error).
"""

from __future__ import annotations

import contextlib
import resource
import threading
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from trials.contract import FAILED_OP_CHARS, FAILED_SHAPE_DIMS, FailedAllocation, Stage, Status
from trials.fsdp_storage import counted_resizes

MiB = 1 << 20


@dataclass(frozen=True)
class Allocation:
    """One storage the tracker saw created: the op that asked for it, its shape and dtype, its bytes."""

    op: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int


def local_shard(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard, the tensor whose storage holds this rank's bytes; any other tensor itself. A DTensor is
    a wrapper whose own storage has the GLOBAL size (a 1024 x 256 fp32 parameter sharded over 2 ranks: 1 MiB, its
    shard 0.5 MiB): FSDP2's parameters, gradients and AdamW states are counted by their shards."""
    inner = getattr(t, "_local_tensor", None)
    return inner if isinstance(inner, torch.Tensor) else t


class LiveTensorTracker(TorchDispatchMode):
    """Counts the bytes of live tensor storages created while it is active (or registered with :meth:`track`).

    ``peak`` is the high-water mark of ``live``; with ``capacity`` set, a storage that would pass it raises
    ``torch.OutOfMemoryError`` (the new storage is dropped with the exception). Works with real and fake tensors: only
    ``untyped_storage().nbytes()`` is read, never data. Storages are keyed by the identity of their (preserved) Python
    object and forgotten through a weakref finalizer when torch frees them.
    """

    def __init__(self, capacity: int | None = None) -> None:
        super().__init__()
        self.capacity = capacity
        self.live = 0
        self.peak = 0
        self._sizes: dict[int, int] = {}  # id(storage) -> counted bytes
        self._host: set[int] = set()  # storages moved off the emulated device (offloaded optimizer state)
        self._paused = 0
        self._lock = threading.Lock()
        self.oom_need: int | None = None  # live bytes + the allocation refused at the capacity (a lower bound)
        self.keep_largest = 0  # how many of the largest new storages to name (0: none; see largest_since)
        self.largest: list[Allocation] = []  # the largest storages created since largest_since, largest first
        self.refused: FailedAllocation | None = None  # the last allocation refused at the capacity (op, shape, live)
        self._forward_depth = 0  # modules whose forward is running (global module hooks, while the mode is active)
        self._stepping = 0  # torch optimizers whose step is running (global optimizer hooks)
        self._hooks: list[Any] = []
        self._resizes: contextlib.AbstractContextManager[None] = contextlib.nullcontext()

    # -- accounting -------------------------------------------------------------------------------------------------
    def track(self, tensors: Iterable[Any]) -> None:
        """Counts tensors created outside the mode (e.g. a model built before the tracker started)."""
        for t in tensors:
            if isinstance(t, torch.Tensor):
                self._add(t, check=False)

    def largest_since(self, keep: int = 3) -> None:
        """From now on, name the ``keep`` largest storages created (op, shape, dtype, bytes) in ``largest``."""
        self.keep_largest = keep
        self.largest = []

    def _name(self, func: Any, t: torch.Tensor, nbytes: int) -> None:
        if nbytes <= 0 or (len(self.largest) >= self.keep_largest and nbytes <= self.largest[-1].nbytes):
            return
        op = str(getattr(func, "__name__", func))
        self.largest.append(
            Allocation(op=op, shape=tuple(t.shape), dtype=str(t.dtype).replace("torch.", ""), nbytes=nbytes)
        )
        self.largest.sort(key=lambda a: -a.nbytes)
        del self.largest[self.keep_largest :]

    def _add(self, t: torch.Tensor, check: bool = True, inputs: frozenset[int] = frozenset(), func: Any = None) -> int:
        """Counts ``t``'s storage if new (or grown); returns the bytes it added. One past the capacity is refused:
        ``refused`` records it (the op ``func`` that asked, ``t``'s shape, the bytes live at that instant)."""
        t = local_shard(t)
        if t.layout is not torch.strided or t.device.type not in ("cpu", "cuda"):
            return 0  # meta tensors (shapes only, e.g. DeepSpeed ZeRO-1/2's round_robin_bit16_meta) hold no memory
        try:
            storage = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # tensor subclasses without a storage
            return 0
        key = id(storage)
        nbytes = storage.nbytes()
        with self._lock:
            if key in self._host:
                return 0
            old = self._sizes.get(key)
            if old is None and key in inputs:
                return 0  # a view of (or in-place op on) a storage created before tracking: not a new storage
            if old is None:
                self._sizes[key] = nbytes
                weakref.finalize(storage, self._free, key)
                delta = nbytes
            else:  # a storage resized in place (resize_, ZeRO-3 partitioning)
                self._sizes[key] = nbytes
                delta = nbytes - old
            self.live += delta
            over = check and self.capacity is not None and delta > 0 and self.live > self.capacity
            if over:
                self.live -= delta
                self._sizes[key] = nbytes - delta
                self.oom_need = max(self.oom_need or 0, self.live + delta)
                self.refused = refused(func, t, delta, self.live, self.capacity, self.stage())
            elif self.live > self.peak:
                self.peak = self.live
        if over:
            raise torch.OutOfMemoryError(
                f"emulated device out of memory: tried to allocate {delta / MiB:.2f} MiB with "
                f"{self.live / MiB:.2f} MiB live of {self.capacity / MiB:.2f} MiB capacity"  # type: ignore[operator]
            )
        return delta

    def _free(self, key: int) -> None:
        with self._lock:
            self._host.discard(key)
            self.live -= self._sizes.pop(key, 0)

    def resized(self, t: torch.Tensor) -> None:
        """Recounts ``t``'s storage after a resize outside the dispatcher (FSDP2's, trials.fsdp_storage)."""
        if not self._paused:
            self._add(t)

    def mark_host(self, tensors: Iterable[Any]) -> int:
        """Takes tensors off the device (host memory, e.g. an offloaded optimizer's state); returns the bytes freed."""
        freed = 0
        for t in tensors:
            if not isinstance(t, torch.Tensor):
                continue
            try:
                storage = local_shard(t).untyped_storage()
            except (RuntimeError, NotImplementedError):
                continue
            key = id(storage)
            with self._lock:
                if key in self._host:
                    continue
                size = self._sizes.get(key)
                if size is None:
                    self._sizes[key] = 0
                    weakref.finalize(storage, self._free, key)
                    size = 0
                self._sizes[key] = 0
                self._host.add(key)
                self.live -= size
                freed += size
        return freed

    def device_bytes(self, t: torch.Tensor) -> int:
        """The bytes of ``t``'s storage (a DTensor's shard) counted on the device now (0: on the host, or not seen)."""
        try:
            key = id(local_shard(t).untyped_storage())
        except (RuntimeError, NotImplementedError):
            return 0
        with self._lock:
            return 0 if key in self._host else self._sizes.get(key, 0)

    # -- where in a step an allocation is asked for ----------------------------------------------------------------
    def stage(self) -> Stage | None:
        """The stage of a train step running now: the backward (autograd is running a node: a checkpointed
        forward's recomputation included), a torch optimizer's step, a module's forward; None: none of them (e.g.
        ZeRO's own step work outside its inner optimizer, a collate)."""
        if torch._C._current_autograd_node() is not None:
            return "backward"
        if self._stepping:
            return "optimizer step"
        return "forward" if self._forward_depth else None

    def __enter__(self) -> LiveTensorTracker:
        from torch.nn.modules import module
        from torch.optim import optimizer

        def enter_forward(*_: Any) -> None:
            self._forward_depth += 1

        def leave_forward(*_: Any) -> None:
            self._forward_depth = max(0, self._forward_depth - 1)

        def enter_step(*_: Any) -> None:
            self._stepping += 1

        def leave_step(*_: Any) -> None:
            self._stepping = max(0, self._stepping - 1)

        self._resizes = counted_resizes(self.resized)
        self._resizes.__enter__()
        self._hooks = [
            module.register_module_forward_pre_hook(enter_forward),
            module.register_module_forward_hook(leave_forward, always_call=True),
            optimizer.register_optimizer_step_pre_hook(enter_step),
            optimizer.register_optimizer_step_post_hook(leave_step),
        ]
        super().__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        self._resizes.__exit__(None, None, None)

    def reset_peak(self) -> None:
        self.peak = self.live

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """New storages are not counted inside (host-side work such as a CPU-offloaded optimizer step)."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if not self._paused:
            # torch.tensor(data) builds its storage outside dispatch and then lifts it: that storage is new
            fresh = func in _LIFT_FRESH
            inputs = frozenset() if fresh else frozenset(_storage_ids(tree_leaves((args, kwargs))))
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    added = self._add(t, inputs=inputs, func=func)
                    if self.keep_largest:
                        self._name(func, t, added)
        return out


def op_name(func: Any) -> str:
    """An aten op's name as the trace names it (``mm.default``), at most FAILED_OP_CHARS characters."""
    return str(getattr(func, "__name__", func))[:FAILED_OP_CHARS]


def refused(
    func: Any, t: torch.Tensor, nbytes: int, live: int, capacity: int | None, stage: Stage | None
) -> FailedAllocation:
    """The allocation the emulated device refused, bounded (a short op name, at most FAILED_SHAPE_DIMS dims)."""
    return FailedAllocation(
        nbytes=nbytes,
        live=max(0, live),
        capacity=capacity,
        op=op_name(func) if func is not None else None,
        shape=list(t.shape)[:FAILED_SHAPE_DIMS],
        dtype=str(t.dtype).replace("torch.", ""),
        stage=stage,
    )


_LIFT_FRESH = {torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default}


def _storage_ids(leaves: Iterable[Any]) -> Iterator[int]:
    for t in leaves:
        if isinstance(t, torch.Tensor) and t.layout is torch.strided:
            try:
                yield id(t.untyped_storage())
            except (RuntimeError, NotImplementedError):
                continue


def module_tensors(module: torch.nn.Module) -> Iterator[torch.Tensor]:
    yield from module.parameters()
    yield from module.buffers()


def optimizer_tensors(optimizer: Any) -> Iterator[torch.Tensor]:
    """The params (and their grads) and the state tensors of a torch optimizer."""
    for group in getattr(optimizer, "param_groups", []):
        for p in group.get("params", []):
            if isinstance(p, torch.Tensor):
                yield p
                if p.grad is not None:
                    yield p.grad
    for state in getattr(optimizer, "state", {}).values():
        if isinstance(state, dict):
            for v in state.values():
                if isinstance(v, torch.Tensor):
                    yield v


# -- the OOM predicate ----------------------------------------------------------------------------------------------
_OOM_TEXTS = (
    "can't allocate memory",  # torch's CPU allocator under RLIMIT_DATA
    "cuda out of memory",
    "out of memory",
    "cudnn_status_not_supported",  # cuDNN failing for lack of workspace
    "cublas_status_alloc_failed",
    "cuda error: out of memory",
)
# a cuBLAS handle that cannot be created (cublasCreate needs workspace) when the device is full: an OOM
_CUBLAS_INIT = "cublas_status_not_initialized"
# what fails for lack of *host* memory on a CUDA host: pinned (page-locked) buffers, the CPU allocator
_HOST_TEXTS = ("cudahostalloc", "pinned memory", "cachinghostallocator", "can't allocate memory")
_HOST_FRAMES = ("pin_memory", "_pin_memory", "pin_memory_")
DEVICE_FULL = 0.9  # a cuBLAS init failure counts as an OOM when the rank held this fraction of its capacity


def is_oom(exc: BaseException) -> bool:
    """True when ``exc`` means "not enough memory" (after accelerate's utils/memory.py ``should_reduce_batch_size``)."""
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    if isinstance(exc, RuntimeError) and len(exc.args) == 1 and isinstance(exc.args[0], str):
        text = exc.args[0].lower()
        return any(t in text for t in _OOM_TEXTS)
    return False


def memory_failure(
    exc: BaseException, *, cuda: bool, device_full: bool = False, frames: tuple[str, ...] = ()
) -> Status | None:
    """ "oom" (the device), "host-oom" (host memory on a CUDA host) or None (not a memory failure).

    On the emulated CPU device host memory *is* the device, so every memory failure is "oom". On CUDA: a Python
    MemoryError, the CPU allocator's "can't allocate memory" and a failed pinned allocation (its text, or a
    ``pin_memory`` frame in ``frames``, the traceback's function names) are host memory; torch's OutOfMemoryError,
    cuBLAS / cuDNN / NCCL allocation failures are the device; CUBLAS_STATUS_NOT_INITIALIZED is the device when the
    rank held ``DEVICE_FULL`` of its capacity when it failed (``device_full``), else an ordinary error.
    """
    text = str(exc).lower()
    memoryish = is_oom(exc) or (isinstance(exc, RuntimeError) and "out of memory" in text)
    if not cuda:
        return Status.OOM if memoryish else None
    if isinstance(exc, MemoryError) or (memoryish and any(t in text for t in _HOST_TEXTS)):
        return Status.HOST_OOM
    if memoryish and any(f in _HOST_FRAMES for f in frames):
        return Status.HOST_OOM
    if memoryish:
        return Status.OOM
    if _CUBLAS_INIT in text and device_full:
        return Status.OOM
    return None


def traceback_frames(exc: BaseException) -> tuple[str, ...]:
    """The function names along ``exc``'s traceback (where it was raised from)."""
    import traceback

    return tuple(frame.name for frame in traceback.extract_tb(exc.__traceback__))


# -- host memory ---------------------------------------------------------------------------------------------------
def _status_kib(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def current_rss() -> int:
    return _status_kib("VmRSS") * 1024


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def set_data_limit(budget: int, slack: int = 1 << 30) -> int:
    """RLIMIT_DATA = what the process maps now + ``budget`` + ``slack``: the real backstop under the emulated device.

    The slack covers what is not a tensor on the device (allocator fragmentation, gloo buffers, thread stacks).
    Returns the limit set, in bytes; never raises the hard limit.
    """
    limit = _status_kib("VmData") * 1024 + 2 * budget + slack
    _soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    return limit
