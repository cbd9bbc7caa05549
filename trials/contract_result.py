"""The probe contract's results: what each rank writes (RankResult, RankReason, RankMemory, StepStats, the refused
allocation) and what the runner merges them into (ProbeResult), with the memory-need rule both sides read. Part of the
contract (trials.contract re-exports it); no torch."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from trials.contract_batches import BatchDims, Strict
from trials.status import RankStatus

# Where a probe rank is: building the engine, training steps, the eval forward, the eval generate.
Phase = Literal["setup", "train", "eval", "generate"]


# A rank that finds more than this many bytes of its GPU in use right after creating its own CUDA context (which
# costs ~0.5 GiB on Hopper) is on a GPU another process uses: status "device-busy", no probe run.
DEVICE_BUSY_BYTES = 2 << 30


def memory_need(peak_reserved: int, overhead: int, device_used_peak: int | None, peak_allocated: int = 0) -> int:
    """What a rank needs of its device: the caching allocator's peak reserve plus what lives outside it (the CUDA
    context, NCCL's communicator buffers, cuBLAS/cuDNN handles), or the device-level use sampled in the memory window
    when that is more (fragmentation, an allocation the allocator did not see). The stability rule and the memory
    estimate's calibration both read this. On the emulated CPU device: overhead 0, no device sampling, = peak. The
    reserve is never below what was allocated (a result that records only the allocated peak counts that)."""
    return max(max(peak_reserved, peak_allocated) + max(0, overhead), device_used_peak or 0)


def device_busy(used_at_start: int, threshold: int = DEVICE_BUSY_BYTES) -> bool:
    """True when a rank's GPU is in use by someone else: more than ``threshold`` bytes used (cudaMemGetInfo's total -
    free) right after the rank created its context and before it allocated anything."""
    return used_at_start > threshold


#: the phases a probe measures a peak of (RankMemory.phases), in order
MEMORY_PHASES = ("train", "eval_forward", "generate")


#: the stage of a train step an allocation was asked for in (trials.memory.LiveTensorTracker)
Stage = Literal["forward", "backward", "optimizer step"]
FAILED_OP_CHARS = 120  # a failed allocation's op name is kept to this many characters (the stored row stays small)
FAILED_SHAPE_DIMS = 8


class FailedAllocation(Strict):
    """The allocation an out-of-memory refused, as the rank saw it at that instant (bounded: a short op name and at
    most ``FAILED_SHAPE_DIMS`` dimensions). The emulated device knows the op, shape and dtype that asked; on CUDA the
    out-of-memory observer knows the size and what was allocated (the op is in the memory snapshot's stack frames)."""

    nbytes: int = Field(ge=0)  # what was asked for
    live: int = Field(0, ge=0)  # bytes in use on the device (this rank's allocations) when it was asked for
    capacity: int | None = None  # the rank's device memory
    op: str | None = Field(None, max_length=FAILED_OP_CHARS)
    shape: list[int] = Field(default_factory=list, max_length=FAILED_SHAPE_DIMS)
    dtype: str | None = Field(None, max_length=32)
    phase: Phase | None = None  # where the rank was (setup, train, eval, generate)
    stage: Stage | None = None  # within a train step: forward, backward or the optimizer step


class RankMemory(Strict):
    rank: int
    peak_allocated: int = 0  # bytes: CUDA max_memory_allocated, or the emulated device's peak live bytes on CPU
    peak_reserved: int = 0  # bytes: CUDA max_memory_reserved (== peak_allocated on the emulated device)
    peak_rss: int | None = None  # bytes above the pre-model baseline, CPU only, for reference
    capacity: int | None = None  # bytes the rank could use (device_memory or the device's total)
    alloc_retries: int = 0  # CUDA num_alloc_retries (cudaMalloc retries after freeing the cache)
    oom_need: int | None = None  # emulated device, after an OOM: live bytes + the refused allocation (at least needed)
    # CUDA only (0 / None on the emulated device): bytes of the device outside this rank's caching allocator (device
    # used - reserved, the most seen in the memory window: context, NCCL, handles), the device-level use sampled
    # over the window (torch.cuda.mem_get_info), and the device-level use at rank start (before any allocation)
    overhead: int = 0
    device_used_peak: int | None = None
    device_used_start: int | None = None
    # the peak allocated bytes of each phase of the memory window (MEMORY_PHASES: the train step, then the eval
    # forward and generate when the job evaluates); peak_allocated is the most of them and the timed steps
    phases: dict[str, int] = Field(default_factory=dict)
    # after an OOM: the allocation refused (FailedAllocation), and on CUDA the memory snapshot the out-of-memory
    # observer wrote (a path; pytorch.org/memory_viz reads it), None where none was written
    failed_allocation: FailedAllocation | None = None
    snapshot: str | None = None

    @property
    def need(self) -> int:
        """What this rank needs of its device (:func:`memory_need`)."""
        return memory_need(self.peak_reserved, self.overhead, self.device_used_peak, self.peak_allocated)


class StepStats(Strict):
    micro_mean_s: float  # a forward+backward micro-step without optimizer step
    micro_p50_s: float
    micro_max_s: float
    optimizer_step_s: float  # a micro-step that ends with the optimizer step (boundary)
    cycle_s: float  # one full accumulation cycle: (accum - 1) * micro + boundary
    cycles: int = 0  # the timed window's whole accumulation cycles (0: not recorded)
    spread: float | None = None  # (max - min) / median of the cycle times the window stopped on


class RankResult(Strict):
    """What one rank writes to its own result file."""

    rank: int
    status: RankStatus
    cause: str | None = None
    memory: RankMemory | None = None
    steps: StepStats | None = None
    setup_s: float | None = None  # process start to first step (imports, model build, engine init)
    versions: dict[str, str] = Field(default_factory=dict)
    fingerprint: dict[str, str | int | float] = Field(default_factory=dict)
    # where setup_s went, seconds: "start" (launch to probe code: spawn + imports), "dist", "model", "engine"
    setup_phases: dict[str, float] = Field(default_factory=dict)
    # where the time after the first step went, seconds: "memory_window" (its cycles), "eval_forward", "generate",
    # "timed_build" (the timed batches), "timed" (the timed window)
    run_phases: dict[str, float] = Field(default_factory=dict)
    phase: Phase | None = None  # where a failed rank was when it failed
    # the rank could not use its device because of how it was launched (forked from a process that had initialised
    # CUDA): no verdict on the config; the runner runs it again in a fresh interpreter
    launch_fault: bool = False
    # with DataBatches: the shapes this rank built, read back from its tensors (the memory window's, then each timed
    # step's in order); empty at a fixed shape
    memory_shape: BatchDims | None = None
    timed_shapes: list[BatchDims] = Field(default_factory=list)
    # FSDP2: whether every parameter came back from the engine's preparation as a shard (a DTensor); None: an engine
    # that does not shard them this way
    sharded: bool | None = None


class RankReason(Strict):
    """Why a rank ended without its result file, in its own words: written (atomically, once) by the rank's hooks
    (trials.last_words) at ``reason_path`` of its result, the moment it knows. The runner reads it before the rank's
    exit code; only a rank that could say nothing (SIGKILL, an abort inside a C++ library) is read from its stderr."""

    rank: int
    status: RankStatus
    cause: str
    source: Literal["exception", "signal", "thread", "result-write"]  # which hook spoke: see trials.last_words
    phase: Phase | None = None
    launch_fault: bool = False  # as RankResult.launch_fault


class ProbeNode(Strict):
    """One node of a probe across nodes: its name (the worker's ``host:pid``), the address its ranks used, the global
    ranks torchrun gave its local ranks (c10d: node order is join order), its hardware and library versions."""

    name: str
    address: str = ""
    ranks: dict[int, int] = Field(default_factory=dict)  # local rank -> global rank (the ones that said)
    fingerprint: dict[str, str | int | float] = Field(default_factory=dict)
    versions: dict[str, str] = Field(default_factory=dict)


class ProbeResult(Strict):
    status: RankStatus
    cause: str | None = None
    phase: Phase | None = None  # of the rank whose failure names the probe's (e.g. an OOM in the eval generate)
    samples_per_s: float | None = None  # at the global batch, over whole accumulation cycles
    # input tokens/s. batches "fixed": samples_per_s * max_length (every row padded to it, so padded = real);
    # "drawn": the real input tokens of the drawn batches (padding excluded) per second, padded_tokens_per_s beside it
    tokens_per_s: float | None = None
    batches: Literal["fixed", "drawn"] = "fixed"  # what the timed steps ran on (ProbeConfig.batches)
    padded_tokens_per_s: float | None = None  # "drawn": the input tokens the device computed on, padding included
    memory_shape: BatchDims | None = None  # "drawn": what the memory window ran (rank 0's, read back)
    timed_shapes: list[list[BatchDims]] = Field(default_factory=list)  # "drawn": per rank, each timed step's shape
    steps: StepStats | None = None  # of rank 0
    ranks: list[RankMemory] = Field(default_factory=list)
    capacity: int | None = None
    versions: dict[str, str] = Field(default_factory=dict)
    fingerprint: dict[str, str | int | float] = Field(default_factory=dict)
    wall_s: float = 0.0  # the probe's wall clock, launch to last rank exit
    setup_s: float | None = None  # the fixed cost: launch to first step
    setup_phases: dict[str, float] = Field(default_factory=dict)  # of the slowest rank (RankResult.setup_phases)
    run_phases: dict[str, float] = Field(default_factory=dict)  # of that rank (RankResult.run_phases)
    attempts: int = 1  # launches it took: a transient failure (an outside kill, a launch failure) is retried once
    sharded: bool | None = None  # FSDP2: every rank's parameters were shards (RankResult.sharded); None: not FSDP2
    nodes: list[ProbeNode] = Field(default_factory=list)  # a probe across nodes: each node's part (none on one host)

    @property
    def memory_need(self) -> int | None:
        """The most any rank needs of its device (RankMemory.need): what the stability rule compares."""
        return max((r.need for r in self.ranks), default=None)

    @property
    def device_used_peak(self) -> int | None:
        return max((r.device_used_peak for r in self.ranks if r.device_used_peak is not None), default=None)

    @property
    def overhead(self) -> int | None:
        return max((r.overhead for r in self.ranks), default=None)

    @property
    def peak_allocated(self) -> int | None:
        return max((r.peak_allocated for r in self.ranks), default=None)

    @property
    def phase_peaks(self) -> dict[str, int]:
        """The peak allocated bytes of each measured phase (MEMORY_PHASES), the most over the ranks."""
        out: dict[str, int] = {}
        for r in self.ranks:
            for phase, peak in r.phases.items():
                out[phase] = max(out.get(phase, 0), peak)
        return {p: out[p] for p in MEMORY_PHASES if p in out}

    @property
    def oom_need(self) -> int | None:
        """After an OOM on the emulated device: the most bytes a rank was refused at (a lower bound of the need)."""
        return max((r.oom_need for r in self.ranks if r.oom_need), default=None)

    @property
    def peak_reserved(self) -> int | None:
        return max((r.peak_reserved for r in self.ranks), default=None)

    @property
    def alloc_retries(self) -> int:
        return sum(r.alloc_retries for r in self.ranks)
