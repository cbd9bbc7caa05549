"""The GPUs of this host as the search sees them, without initialising CUDA in the tuner's own process.

Pure decisions (tested on CPU): how many GPUs CUDA_VISIBLE_DEVICES leaves visible, whether ``--world-size`` fits in
them, which per-GPU lock a probe's ranks take, whether this worker's GPU matches the study's. At the edge: the
device files (/dev/nvidia<N>) and NVML through ctypes (libnvidia-ml, present wherever the driver is): the GPU names.
Neither creates a CUDA context, so the fork server's parent stays fork-safe.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import re
import stat
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from tuner.errors import ConfigError

_DEV = re.compile(r"^nvidia(\d+)$")


# -- pure ----------------------------------------------------------------------------------------------------------
def visible_devices(cuda_visible: str | None, physical: int) -> list[str]:
    """The devices CUDA exposes, as CUDA reads CUDA_VISIBLE_DEVICES: unset = every physical one; otherwise the comma
    list up to its first invalid entry (a negative or out-of-range index, a repeat); GPU-/MIG- UUIDs are taken as
    listed (only the driver can check them)."""
    if cuda_visible is None:
        return [str(i) for i in range(physical)]
    out: list[str] = []
    for raw in cuda_visible.split(","):
        token = raw.strip()
        if not token:
            break
        if token.lstrip("-").isdigit():
            index = int(token)
            if index < 0 or index >= physical:
                break
            token = str(index)
        elif not token.startswith(("GPU-", "MIG-")):
            break
        if token in out:
            break
        out.append(token)
    return out


def check_world_size(world_size: int, visible: Sequence[str], physical: int, cuda_visible: str | None) -> None:
    """On a GPU host, one rank per visible GPU: a ConfigError (one line, exit 2) when ``world_size`` exceeds them.
    A host without GPUs (or with none visible) runs the ranks on the CPU's emulated device: nothing to check."""
    if physical == 0 or not visible or world_size <= len(visible):
        return
    shown = "unset" if cuda_visible is None else repr(cuda_visible)
    raise ConfigError(
        f"--world-size {world_size} needs {world_size} GPUs but {len(visible)} are visible "
        f"(CUDA_VISIBLE_DEVICES {shown}, {physical} on the host); lower --world-size or make more GPUs visible"
    )


def lock_names(world_size: int, visible: Sequence[str], uuid_of: Callable[[int], str] | None = None) -> list[str]:
    """The per-GPU locks a probe of ``world_size`` ranks takes (rank r uses visible device r), sorted (no deadlock
    between workers taking several). Keyed by the GPU itself, not by how this process's CUDA_VISIBLE_DEVICES names it:
    an index is mapped to its UUID (``uuid_of``, NVML's; "index<N>" where NVML cannot say), a UUID is taken as given."""

    def key(dev: str) -> str:
        name = dev
        if dev.isdigit():
            name = (uuid_of(int(dev)) if uuid_of is not None else "") or f"index{dev}"
        return f"gpu-{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}"

    return sorted(key(dev) for dev in visible[:world_size])


def fingerprint_refusal(stored: Mapping[str, Any] | None, here: str, device_memory_given: bool) -> str | None:
    """Why this worker must not join the study (its GPU differs from the one the study's first probe ran on), or
    None. ``stored`` is that probe's fingerprint (trials.fingerprint), ``here`` this host's GPU name ("" without a
    GPU). An explicit --device-memory makes the budget the same on every worker: allowed."""
    if stored is None or device_memory_given:
        return None
    theirs = str(stored.get("gpu_name") or "")
    if theirs == here:
        return None
    return (
        f"this worker's GPU ({here or 'none'}) differs from the one this study was measured on ({theirs or 'none'}): "
        "its frontier would mix two devices' limits; use a new --study, or give --device-memory to search one budget"
    )


# The quick start's memory per rank: on the CPU an emulated device of 160 MiB; on a GPU the CUDA context (0.5-1 GiB,
# outside the caching allocator) alone is more than that, so no probe could ever be stable there: a 2 GiB share of the
# card instead, in which the tiny T5's largest DeepSpeed buckets (2e8 elements: 763 MiB each) still run out of memory.
QUICKSTART_CPU_MEMORY = "160MiB"
QUICKSTART_GPU_MEMORY = "2GiB"


def quickstart_device_memory(physical: int, visible: Sequence[str]) -> str:
    """The quick start's --device-memory on this host (pure): QUICKSTART_GPU_MEMORY with a visible GPU, else
    QUICKSTART_CPU_MEMORY."""
    return QUICKSTART_GPU_MEMORY if physical > 0 and visible else QUICKSTART_CPU_MEMORY


# -- the edge: device files, NVML, lock files ------------------------------------------------------------------------
def physical_gpus(dev: Path = Path("/dev")) -> int:
    """NVIDIA GPUs whose device files this host (container) has."""
    try:
        return sum(1 for name in os.listdir(dev) if _DEV.match(name))
    except OSError:
        return 0


def host_visible_devices(env: Mapping[str, str] | None = None) -> tuple[list[str], int, str | None]:
    """(visible devices, physical count, the CUDA_VISIBLE_DEVICES value) of this host and environment."""
    env = os.environ if env is None else env
    physical = physical_gpus()
    cuda_visible = env.get("CUDA_VISIBLE_DEVICES")
    return visible_devices(cuda_visible, physical), physical, cuda_visible


def has_visible_gpus(env: Mapping[str, str] | None = None) -> bool:
    """Whether ranks started with ``env`` see NVIDIA GPUs (DeepSpeed then runs its CUDA accelerator)."""
    visible, physical, _ = host_visible_devices(env)
    return physical > 0 and bool(visible)


@contextlib.contextmanager
def _nvml_device(index: int) -> Iterator[tuple[Any, ctypes.c_void_p] | None]:
    """(NVML, the handle of physical GPU ``index``) while NVML is initialised; None without the driver or the GPU."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        yield None
        return
    if nvml.nvmlInit_v2() != 0:
        yield None
        return
    try:
        handle = ctypes.c_void_p()
        found = nvml.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(handle)) == 0
        yield (nvml, handle) if found else None
    finally:
        nvml.nvmlShutdown()


def gpu_name(index: int = 0) -> str:
    """The name of physical GPU ``index`` from NVML (as torch's get_device_properties reports it), "" without one."""
    return _nvml_string(index, "nvmlDeviceGetName")


def _nvml_string(index: int, call: str) -> str:
    """An NVML string query (``nvmlDeviceGetName``, ``nvmlDeviceGetUUID``) of physical GPU ``index``; "" without one
    or on an NVML error."""
    with _nvml_device(index) as device:
        if device is None:
            return ""
        nvml, handle = device
        buf = ctypes.create_string_buffer(96)
        if getattr(nvml, call)(handle, buf, ctypes.c_uint(96)) != 0:
            return ""
        return buf.value.decode(errors="replace")


class _NvmlMemory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


def gpu_memory(index: int = 0) -> int | None:
    """The memory of physical GPU ``index`` in bytes (NVML's total), None without one."""
    with _nvml_device(index) as device:
        if device is None:
            return None
        nvml, handle = device
        info = _NvmlMemory()
        if nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(info)) != 0:
            return None
        return int(info.total)


def gpu_capability(index: int) -> tuple[int, int] | None:
    """The CUDA compute capability of physical GPU ``index`` from NVML ((9, 0) on Hopper), None without one."""
    with _nvml_device(index) as device:
        if device is None:
            return None
        nvml, handle = device
        major, minor = ctypes.c_int(), ctypes.c_int()
        if nvml.nvmlDeviceGetCudaComputeCapability(handle, ctypes.byref(major), ctypes.byref(minor)) != 0:
            return None
        return int(major.value), int(minor.value)


def visible_capabilities(env: Mapping[str, str] | None = None) -> list[tuple[int, int]]:
    """The compute capabilities of the GPUs ranks started with ``env`` see (by index; a UUID entry reads GPU 0's)."""
    visible, physical, _ = host_visible_devices(env)
    if physical == 0:
        return []
    found = (gpu_capability(int(v) if v.isdigit() else 0) for v in visible)
    return sorted({cap for cap in found if cap is not None})


def first_visible_index(visible: Sequence[str]) -> int:
    """The physical index of the first visible device (0 for a UUID: NVML would be needed to map it)."""
    return int(visible[0]) if visible and visible[0].isdigit() else 0


def gpu_uuid(index: int) -> str:
    """The UUID of physical GPU ``index`` from NVML ("GPU-..."), "" without one."""
    return _nvml_string(index, "nvmlDeviceGetUUID")


# one directory for the whole host (never $TMPDIR, which differs between workers), sticky like /tmp: the workers of
# every user share the locks, none can remove or replace another's lock file (issue 23 §9); the lock files are 0644:
# anyone can open one read-only to flock it, only its maker can write it (issue 24 §6: no 0666 files anyone can hold
# open for writing); a directory of another user's that is not sticky is refused (they could swap the files)
LOCK_DIR = Path("/tmp/tuner-gpu-locks")


def lock_dir_ok(mode: int, owner: int, uid: int) -> bool:
    """Whether a lock directory of this ``mode`` and ``owner`` is safe for user ``uid`` to lock in: its own, or
    sticky (nobody removes another's file) and not a symlink's target we cannot judge."""
    return owner == uid or bool(mode & stat.S_ISVTX)


def _lock_dir(path: Path) -> Path:
    with contextlib.suppress(FileExistsError):
        path.mkdir(parents=True, mode=0o700)
        path.chmod(0o1777)  # ours, made now: shared and sticky (the umask cannot widen it later)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode):
        raise OSError(f"{path} is not a directory (a symlink or a file): remove it")
    if not lock_dir_ok(info.st_mode, info.st_uid, os.getuid()):
        raise OSError(f"{path} belongs to uid {info.st_uid} and is not sticky: its owner must chmod 1777 it")
    return path


def _open_lock(path: Path) -> int:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644)  # flock needs no write access
    except PermissionError:  # another user's file we may not create in a non-sticky dir of ours: read it
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with contextlib.suppress(PermissionError):
        if os.fstat(fd).st_uid == os.getuid():
            os.fchmod(fd, 0o644)  # the umask could have narrowed it: others must be able to open it to lock
    return fd


@contextlib.contextmanager
def gpu_locks(names: Sequence[str], timeout_s: float, lock_dir: Path = LOCK_DIR) -> Iterator[bool]:
    """Holds an exclusive flock on each named GPU (one probe per GPU across the workers of this host); yields False
    when they were not all free within ``timeout_s`` (nothing is held then). The kernel drops a dead holder's lock."""
    _lock_dir(lock_dir)
    held: list[int] = []
    deadline = time.monotonic() + timeout_s
    try:
        for name in names:
            fd = _open_lock(lock_dir / name)
            held.append(fd)
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() >= deadline:
                        if exc.errno not in (errno.EAGAIN, errno.EACCES):
                            raise
                        yield False
                        return
                    time.sleep(0.2)
        yield True
    finally:
        for fd in held:
            os.close(fd)  # closing drops the flock
