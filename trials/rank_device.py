"""One probe rank's device memory: its setup (the emulated device's live-tensor tracker and RLIMIT_DATA backstop on
CPU; the GPU take, busy check and per-process fraction on CUDA), what the memory window samples (device-level use,
use outside the caching allocator, the per-phase peaks), and the RankMemory the rank reports, with the refused
allocation and the CUDA memory snapshot after an OOM."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from trials import memory
from trials.contract import Phase, ProbeConfig, RankMemory
from trials.cuda_setup import take_device
from trials.measure import DeviceSampler, PhasePeaks, device_used
from trials.oom_snapshot import OomSnapshot


class RankDevice:
    def __init__(self, config: ProbeConfig, device: torch.device, rank: int) -> None:
        self.config = config
        self.device = device
        self.rank = rank
        self.cuda = device.type == "cuda"
        self.tracker: memory.LiveTensorTracker | None = None
        self.capacity: int | None = None
        self.baseline_rss = 0
        # CUDA device-level use (bytes): at rank start, the most seen in the memory window, and the most seen outside
        # the caching allocator at a step's end
        self.used_start: int | None = None
        self.used_peak: int | None = None
        self.overhead = 0
        self.peaks = PhasePeaks.of(lambda: self.tracker, device)  # per phase of the memory window
        self.snapshot: OomSnapshot | None = None  # CUDA: the memory snapshot an OOM in the window writes

    def setup(self) -> None:
        budget = self.config.device_memory
        self.baseline_rss = memory.current_rss()
        if self.cuda:
            self.used_start = take_device(self.device, self.config.busy_bytes)
            total = torch.cuda.get_device_properties(self.device).total_memory
            if budget:
                torch.cuda.set_per_process_memory_fraction(min(1.0, budget / total), self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.capacity = min(budget, total) if budget else total
        else:
            self.tracker = memory.LiveTensorTracker(capacity=budget)
            if budget:
                memory.set_data_limit(budget)
            self.capacity = budget

    def tracking(self) -> contextlib.AbstractContextManager[Any]:
        """The memory window's context: the emulated device's tracker, else the CUDA snapshot's recording."""
        if self.tracker is not None:
            return self.tracker
        return self.snapshot if self.snapshot is not None else contextlib.nullcontext()

    def sampling(self) -> contextlib.AbstractContextManager[Any]:
        return DeviceSampler(self.device) if self.cuda else contextlib.nullcontext()

    def sampled(self, sampler: DeviceSampler | None) -> None:
        """The device-level peak a window's sampler saw."""
        if sampler is not None:
            self.used_peak = max(self.used_peak or 0, sampler.peak)

    def quiet_sample(self) -> None:
        """At a step's end (no allocation in flight): the device-level use, and what of it is outside the allocator."""
        if not self.cuda:
            return
        torch.cuda.synchronize(self.device)
        used = device_used(self.device)
        self.used_peak = max(self.used_peak or 0, used)
        self.overhead = max(self.overhead, used - torch.cuda.memory_reserved(self.device))

    def report(self, phase: Phase) -> RankMemory:
        """What this rank reports of its memory (``phase``: where it was, for a refused allocation)."""
        rss = max(0, memory.peak_rss() - self.baseline_rss)
        allocated, reserved = self.peaks.overall()
        if self.cuda:
            stats = torch.cuda.memory_stats(self.device)
            return RankMemory(
                rank=self.rank,
                peak_allocated=allocated,
                peak_reserved=reserved,
                phases=dict(self.peaks.peaks),
                peak_rss=rss,
                capacity=self.capacity,
                alloc_retries=int(stats.get("num_alloc_retries", 0)),
                overhead=self.overhead,
                device_used_peak=self.used_peak,
                device_used_start=self.used_start,
                **self._failed(phase),
            )
        return RankMemory(
            rank=self.rank,
            peak_allocated=allocated,
            peak_reserved=allocated,
            phases=dict(self.peaks.peaks),
            capacity=self.capacity,
            peak_rss=rss,
            oom_need=self.tracker.oom_need if self.tracker is not None else None,
            **self._failed(phase),
        )

    def _failed(self, phase: Phase) -> dict[str, Any]:
        """After an OOM: the refused allocation (with the phase the rank was in) and, on CUDA, the snapshot's path."""
        refused = self.tracker.refused if self.tracker is not None else None
        snap = self.snapshot
        if refused is None and snap is not None:
            refused = snap.failed
        out: dict[str, Any] = {}
        if refused is not None:
            out["failed_allocation"] = refused.model_copy(update={"phase": phase, "capacity": self.capacity})
        if snap is not None and snap.written is not None:
            out["snapshot"] = str(snap.written)
        return out

    def full(self) -> bool:
        """At a failure on CUDA: the rank held ``memory.DEVICE_FULL`` of its capacity (an allocation just failed)."""
        if not self.cuda or not self.capacity:
            return False
        with contextlib.suppress(RuntimeError):
            held = torch.cuda.memory_reserved(self.device) + self.overhead
            return held >= memory.DEVICE_FULL * self.capacity
        return False
