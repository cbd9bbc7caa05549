"""How a probe rank ended, from the exception it raised: the status and exit code (``classify``), whether it was the
launch's fault rather than the config's (``launch_fault``), and the one line a probe row's cause says (``one_line``)."""

from __future__ import annotations

import torch

from trials import memory
from trials.contract import Status

# What CUDA raises in a rank forked from a process that had initialised it (lower case): the rank cannot use its GPU,
# whatever the config; the fork server is then unusable for this runner.
FORKED_CUDA_BROKEN = ("cannot re-initialize cuda in forked subprocess", "cuda error: initialization error")


def one_line(exc: BaseException) -> str:
    """The exception's type and first line, and its direct cause's (DeepSpeed raises "the op failed to build/load"
    from the compiler's error): what the probe row's cause says."""
    text = str(exc).strip().splitlines()
    first = next((line.strip() for line in text if line.strip()), "")
    line = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    cause = exc.__cause__
    if cause is not None and cause is not exc:
        inner = next((x.strip() for x in str(cause).strip().splitlines() if x.strip()), "")
        line += f" (caused by {type(cause).__name__}" + (f": {inner})" if inner else ")")
    return line[:500]


class DeviceBusy(RuntimeError):
    """The rank's GPU is in use by another process (see trials.contract.device_busy)."""


class ConfigRefused(RuntimeError):
    """The config cannot run with this model and these libraries as it stands, said with the reason (an FSDP2 model
    the installed accelerate cannot shard): status "refused", no memory verdict."""


def classify(exc: BaseException, *, cuda: bool = False, device_full: bool = False) -> tuple[Status, int]:
    """The status and exit code of a rank that raised ``exc`` (trials.memory.memory_failure for memory failures). An
    interrupt (SIGINT: the runner never sends one, its ranks run in their own sessions) is an outside stop: "killed"."""
    status = _status(exc, cuda=cuda, device_full=device_full)
    return status, status.exit_code or 0  # every status _status returns is a rank's: it has an exit code


def _status(exc: BaseException, *, cuda: bool, device_full: bool) -> Status:
    if isinstance(exc, KeyboardInterrupt):
        return Status.KILLED
    if isinstance(exc, DeviceBusy):
        return Status.DEVICE_BUSY
    if isinstance(exc, ConfigRefused):
        return Status.REFUSED
    kind = memory.memory_failure(exc, cuda=cuda, device_full=device_full, frames=memory.traceback_frames(exc))
    if kind is not None:
        return kind
    dist_error = getattr(torch.distributed, "DistError", ())
    if (isinstance(exc, dist_error) and "timed out" in str(exc).lower()) or isinstance(exc, TimeoutError):
        return Status.TIMEOUT
    return Status.ERROR


def launch_fault(exc: BaseException) -> bool:
    """True when ``exc`` is CUDA refusing a rank forked from a process that had initialised it (``FORKED_CUDA_BROKEN``):
    the launch's fault, no verdict on the config (RankResult.launch_fault)."""
    current: BaseException | None = exc
    for _ in range(8):  # the exception and what it was raised from (DeepSpeed and transformers re-raise)
        if current is None:
            return False
        if any(mark in str(current).lower() for mark in FORKED_CUDA_BROKEN):
            return True
        current = current.__cause__ or current.__context__
    return False
