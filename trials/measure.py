"""What a probe rank measures with, pure where it can be: the memory window's reset and end (``MemoryWindow``), the
timed window's steps (``split_steps``, ``step_stats``, ``StepClock``), and the CUDA device-level use around
torch.cuda (``device_used``, ``wait_for_free_device``, ``DeviceSampler``)."""

from __future__ import annotations

import contextlib
import itertools
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from trials.contract import StepStats, device_busy
from trials.outcome import DeviceBusy

FP16_EXTRA_CYCLES = 16  # loss scale 2^16 halves per overflow: a real step within 16 more cycles, or the probe fails


@dataclass
class MemoryWindow:
    """Decides, cycle by cycle, when the memory window resets its peak and when it ends (pure).

    The peak is reset after the first optimizer step that really ran (AdamW's state then exists); the window ends once
    ``min_cycles`` cycles ran and at least one real step followed the reset. A skipped step (fp16 overflow) counts as
    no step: the window grows by up to ``extra_cycles``; past that, :meth:`record` raises.
    """

    min_cycles: int
    extra_cycles: int = FP16_EXTRA_CYCLES
    cycles: int = 0
    settled: bool = False
    real_after_settle: int = 0
    skipped: int = 0

    def record(self, stepped: bool) -> Literal["settle", "more", "done"]:
        """After each cycle: ``stepped`` = its optimizer step really ran. "settle": reset the peak now."""
        self.cycles += 1
        self.skipped += not stepped
        action: Literal["settle", "more", "done"] = "more"
        if stepped and not self.settled:
            self.settled = True
            action = "settle"
        elif stepped:
            self.real_after_settle += 1
        if self.settled and self.real_after_settle >= 1 and self.cycles >= self.min_cycles:
            return "done"
        if self.cycles >= self.min_cycles + self.extra_cycles:
            raise RuntimeError(
                f"fp16: {self.skipped} of {self.cycles} optimizer steps were skipped (loss-scale overflow), so the "
                "memory window never held a real optimizer step; lower the initial loss scale "
                "(fp16.initial_scale_power) or use bf16"
            )
        return action


@dataclass
class TimedWindow:
    """Decides, cycle by cycle, when the timed window has measured enough (pure): at least ``min_cycles`` whole
    accumulation cycles; then done as soon as the last ``min_cycles`` cycle times agree within ``tolerance`` (their
    spread, (max - min) / median), or at ``max_cycles`` whatever the spread, which :attr:`spread` then reports. A quiet
    GPU stops at the minimum; a noisy host measures longer instead of handing the search a coin toss."""

    min_cycles: int
    max_cycles: int
    tolerance: float
    times: list[float] = field(default_factory=list)

    def record(self, cycle_s: float) -> bool:
        """Adds one cycle's seconds; True when the window is done."""
        self.times.append(cycle_s)
        if len(self.times) < self.min_cycles:
            return False
        return len(self.times) >= self.max_cycles or (self.spread or 0.0) <= self.tolerance

    @property
    def past_minimum(self) -> bool:
        """The measured cycles are run: what follows is the extension a noisy host gets."""
        return len(self.times) >= self.min_cycles

    @property
    def spread(self) -> float | None:
        last = self.times[-max(2, self.min_cycles) :]
        if len(last) < 2:
            return None
        mid = statistics.median(last)
        return (max(last) - min(last)) / mid if mid > 0 else None


def split_steps(durations: Sequence[float], boundaries: Sequence[bool]) -> tuple[list[float], list[float]]:
    """The timed window's per-step seconds split into plain micro-steps and boundary (optimizer) steps."""
    micro = [d for d, b in zip(durations, boundaries, strict=True) if not b]
    boundary = [d for d, b in zip(durations, boundaries, strict=True) if b]
    return micro, boundary


def step_stats(
    micro: Sequence[float], boundary: Sequence[float], accum: int, window: TimedWindow | None = None
) -> StepStats:
    """A full accumulation cycle composed from the probe's steps: ``(accum - 1) * micro + boundary``; with the
    ``window`` that timed them, its cycles and their spread."""
    mean_boundary = statistics.fmean(boundary)
    steps = list(micro) or list(boundary)  # accum == 1: every step is a boundary step
    return StepStats(
        micro_mean_s=statistics.fmean(steps),
        micro_p50_s=statistics.median(steps),
        micro_max_s=max(steps),
        optimizer_step_s=mean_boundary,
        cycle_s=(accum - 1) * statistics.fmean(steps) + mean_boundary,
        cycles=len(window.times) if window is not None else 0,
        spread=window.spread if window is not None else None,
    )


class StepClock:
    """Timestamps between micro-steps: CUDA events on a GPU (no sync per step), perf_counter on CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.marks: list[Any] = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def durations(self) -> list[float]:
        """Seconds between consecutive marks (one synchronisation, on the last mark, on a GPU); clears the marks."""
        marks, self.marks = self.marks, []
        if self.cuda and marks:
            marks[-1].synchronize()
            return [a.elapsed_time(b) / 1000.0 for a, b in itertools.pairwise(marks)]
        return [b - a for a, b in itertools.pairwise(marks)]


# -- CUDA device-level memory (the edge: small functions around torch.cuda) -------------------------------------------
def device_used(device: torch.device) -> int:
    """Bytes of the device in use by every process (cudaMemGetInfo: total - free)."""
    free, total = torch.cuda.mem_get_info(device)
    return int(total - free)


BUSY_WAIT_S = 20.0  # how long a rank waits for its GPU to be released (a killed rank's memory is freed lazily)


def wait_for_free_device(device: torch.device, threshold: int, wait_s: float = BUSY_WAIT_S) -> int:
    """The device-level use once it is at most ``threshold``; raises DeviceBusy after ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        used = device_used(device)
        if not device_busy(used, threshold):
            return used
        if time.monotonic() >= deadline:
            raise DeviceBusy(
                f"GPU {device.index} holds {used / 2**30:.1f} GiB used by other processes at rank start (more than "
                f"{threshold / 2**30:.1f} GiB): another job is on it; free it or pick other GPUs (CUDA_VISIBLE_DEVICES)"
            )
        time.sleep(0.5)


class DeviceSampler:
    """A thread sampling the device-level use every ``period_s`` (the peak between the main thread's samples)."""

    def __init__(self, device: torch.device, period_s: float = 0.005) -> None:
        self.device = device
        self.period_s = period_s
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tuner-device-sampler", daemon=True)

    def _run(self) -> None:
        torch.cuda.set_device(self.device)
        while not self._stop.is_set():
            with contextlib.suppress(RuntimeError):
                self.peak = max(self.peak, device_used(self.device))
            self._stop.wait(self.period_s)

    def __enter__(self) -> DeviceSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@dataclass
class PhasePeaks:
    """The peak allocated bytes of each phase of a probe's memory window (the train step, the eval forward, the
    generate), keeping the window's overall peaks the max of them. ``read`` gives the (allocated, reserved) peaks
    since the last ``reset``: the emulated device's tracker, or torch.cuda's peak stats."""

    read: Callable[[], tuple[int, int]]
    reset: Callable[[], None]
    peaks: dict[str, int] = field(default_factory=dict)
    allocated: int = 0  # the most allocated over the phases ended so far
    reserved: int = 0

    @classmethod
    def of(cls, tracker: Callable[[], Any], device: torch.device) -> PhasePeaks:
        """Over the emulated device's tracker (``tracker()``: the probe's, once made), else torch.cuda's peaks."""

        def read() -> tuple[int, int]:
            if (t := tracker()) is not None:
                return t.peak, t.peak
            if device.type == "cuda":
                return torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)
            return 0, 0

        def reset() -> None:
            if (t := tracker()) is not None:
                t.reset_peak()
            elif device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)

        return cls(read, reset)

    def end(self, phase: str) -> None:
        """Ends ``phase``: its peak recorded, the peaks reset for the next."""
        allocated, reserved = self.read()
        self.peaks[phase] = max(self.peaks.get(phase, 0), allocated)
        self.allocated, self.reserved = max(self.allocated, allocated), max(self.reserved, reserved)
        self.reset()

    def overall(self) -> tuple[int, int]:
        """The window's peaks: the phases' and what came after the last one (the timed steps)."""
        allocated, reserved = self.read()
        return max(self.allocated, allocated), max(self.reserved, reserved)
