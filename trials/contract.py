"""The probe contract: what tuner/ sends to one probe and what comes back.

This is the only module of ``trials`` that ``tuner`` imports. It has no torch import: the search, the API and the
exports all read these models without loading a training stack. Everything both sides of the process boundary must
agree on is defined here once: the models, the exit codes, the environment the runner sets, where each rank writes its
result, the fork server's ready line, the op libraries, and the DeepSpeed defaults a probe runs with.
"""

from __future__ import annotations

import math
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from trials.status import (  # noqa: F401  (re-exported: the contract's status vocabulary)
    EXIT_BUSY,
    EXIT_CODES,
    EXIT_ERROR,
    EXIT_HOST_OOM,
    EXIT_KILLED,
    EXIT_OK,
    EXIT_OOM,
    EXIT_TIMEOUT,
    RankStatus,
    Status,
)

Precision = Literal["fp32", "bf16", "fp16"]
Engine = Literal["torch", "deepspeed"]
# Where a probe rank is: building the engine, training steps, the eval forward, the eval generate.
Phase = Literal["setup", "train", "eval", "generate"]

BUILTIN_PREFIX = "builtin:"
# Built-in model presets (random init from a config, no download); trials/models.py holds their shapes: T5 (seq2seq)
# and Llama-shaped causal LMs, each a CPU-sized one and GPU-sized ones.
BUILTIN_PRESETS: tuple[str, ...] = ("tiny-t5", "t5-small", "flan-t5-large", "tiny-llama", "llama-1b")


# The runner sets this to the wall-clock time.time() at which it launched the probe (the probe's setup_s starts there).
LAUNCH_ENV = "TUNER_PROBE_LAUNCH_T"
# The line `python -m trials.forkserver` prints on stdout once it has preloaded and listens.
FORKSERVER_READY = "trials.forkserver ready"
# DeepSpeed JIT ops a probe may need (`python -m trials.ops KEY ...`): key -> the extension's directory and library
# name under TORCH_EXTENSIONS_DIR (the runner checks the cache, trials.ops builds).
OP_LIBRARIES: dict[str, str] = {"cpu_adam": "cpu_adam", "shm_comm": "deepspeed_shm_comm", "fused_adam": "fused_adam"}

# The DeepSpeed bucket knobs, and DeepSpeed's default (elements) that a probe runs with when a bucket knob is unset
# (None): the export writes it, the estimate and the feasibility frontier assume it.
BUCKET_KNOBS: tuple[str, str] = ("allgather_bucket_size", "reduce_bucket_size")
DS_DEFAULT_BUCKET = 500_000_000

# The caching allocator's settings (the alloc_conf knob). PyTorch >= 2.9 reads PYTORCH_ALLOC_CONF and still honours
# (first) the older PYTORCH_CUDA_ALLOC_CONF: a rank gets both, an export writes both, a rank reports the one in force.
ALLOC_CONF_ENV: tuple[str, str] = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


# A DeepSpeed JSON value the HF Trainer fills at run time (from its TrainingArguments or the model).
AUTO = "auto"

# Top-level DeepSpeed keys that act on the training host without changing what a step computes or keeps in device
# memory: profilers and monitors writing files or contacting a service, the autotuner. A probe runs without them (a
# probe must not write the user's profiles or log to their wandb); an export carries them, listed as "not probed".
DS_HOST_KEYS: frozenset[str] = frozenset(
    {"flops_profiler", "tensorboard", "wandb", "csv_monitor", "comet", "comms_logger", "autotuning", "monitor_config"}
)


def auto_paths(tree: Any, prefix: str = "") -> list[str]:
    """Dotted paths of every value "auto" left in a (nested) config."""
    found: list[str] = []
    if isinstance(tree, Mapping):
        for key, value in tree.items():
            found += auto_paths(value, f"{prefix}{key}.")
    elif isinstance(tree, list):
        for i, value in enumerate(tree):
            found += auto_paths(value, f"{prefix}{i}.")
    elif tree == AUTO:
        found.append(prefix.rstrip("."))
    return found


def allocator_env(alloc_conf: str | None) -> dict[str, str]:
    """The environment a rank needs for the ``alloc_conf`` knob (it must be set before the rank's first CUDA call):
    both variables set to it; nothing when the knob is unset (a value from the user's shell then stays in force)."""
    return {name: alloc_conf for name in ALLOC_CONF_ENV} if alloc_conf else {}


def alloc_conf_in_force(env: Mapping[str, str]) -> str | None:
    """The allocator settings an environment puts in force (the older variable first, as torch reads them)."""
    return next((env[name] for name in ALLOC_CONF_ENV if env.get(name)), None)


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


def rank_out_path(out: Path, rank: int, world_size: int) -> Path:
    """Where a rank writes its RankResult: ``out`` itself for world size 1, else ``<stem>.rank<r><suffix>`` next to
    it (the runner reads them back from there)."""
    if world_size == 1:
        return out
    return out.with_name(f"{out.stem}.rank{rank}{out.suffix or '.json'}")


def reason_path(result: Path) -> Path:
    """Where a rank that cannot write its result file leaves its RankReason instead: next to it (``result.json`` ->
    ``result.reason.json``, ``result.rank1.json`` -> ``result.rank1.reason.json``)."""
    return result.with_name(f"{result.stem}.reason{result.suffix or '.json'}")


def free_port() -> int:
    """A TCP port on 127.0.0.1 free right now (the probe's MASTER_PORT rendezvous; tests' servers)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Knobs(_Strict):
    """The tunable training knobs of one configuration (flat names; tuner/interop/export maps them to each tool)."""

    micro_batch_size: int = Field(ge=1)
    max_length: int = Field(ge=1)
    engine: Engine = "deepspeed"
    zero_stage: int = Field(0, ge=0, le=3)
    allgather_bucket_size: int | None = Field(None, ge=1)
    reduce_bucket_size: int | None = Field(None, ge=1)
    overlap_comm: bool = False
    contiguous_gradients: bool = True
    offload_optimizer: bool = False
    gradient_checkpointing: bool = False
    precision: Precision = "fp32"
    alloc_conf: str | None = None
    eval_batch_size: int | None = Field(None, ge=1)
    generate: bool = False

    @model_validator(mode="after")
    def _consistent(self) -> Knobs:
        if self.engine == "torch" and (self.zero_stage or self.offload_optimizer):
            raise ValueError("engine 'torch' has no ZeRO stage or optimizer offload; use engine 'deepspeed'")
        if self.offload_optimizer and self.zero_stage == 0:
            raise ValueError("offload_optimizer needs zero_stage >= 1")
        return self


class ModelSpec(_Strict):
    """Where the model comes from.

    ``source`` is ``builtin:<preset>`` (random init from a T5Config, no download: ``builtin:tiny-t5``,
    ``builtin:t5-small``, ``builtin:flan-t5-large``), an HF hub id, or a local ``save_pretrained`` directory.
    ``overrides`` adjust a built-in preset's config fields (``d_model``, ``num_layers`` ...).
    """

    source: str = "builtin:tiny-t5"
    overrides: dict[str, int | float | str] = Field(default_factory=dict)
    vocab_size: int | None = None  # filled by the probe from the model's config


LoraBias = Literal["none", "all", "lora_only"]


class LoraSpec(_Strict):
    """LoRA adapters on the base model (peft.LoraConfig's fields, its defaults): the user's job setting, held fixed.

    Every probe of a LoRA job wraps the model with ``peft.get_peft_model`` before its engine is built (trials.lora),
    so only the adapters train and the optimizer holds only their states. ``target_modules`` empty: peft's default
    for the architecture (Llama: q_proj, v_proj; T5: q, v)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    r: int = Field(ge=1, description="rank of the adapters")
    alpha: int = Field(8, ge=1, description="lora_alpha: the adapters' scale is alpha / r")
    dropout: float = Field(0.0, ge=0, lt=1, description="lora_dropout")
    target_modules: tuple[str, ...] = Field((), description="module names to adapt; empty: peft's default")
    bias: LoraBias = Field("none", description="which biases train: none, all, lora_only")

    def describe(self) -> str:
        targets = ",".join(self.target_modules) or "peft's default modules"
        extra = f", dropout {self.dropout:g}" if self.dropout else ""
        extra += f", bias {self.bias}" if self.bias != "none" else ""
        return f"LoRA r {self.r} alpha {self.alpha} on {targets}{extra} (adapters train, base frozen)"


class JobSettings(_Strict):
    """What the user's job fixes that a probe needs beside the knobs (tuner.job.definition.Job holds the rest)."""

    max_target_length: int | None = Field(None, ge=1, description="seq2seq label length; None: max_length")
    generation_max_length: int | None = Field(None, ge=1, description="new tokens of an eval generate; None: labels")
    num_beams: int = Field(1, ge=1, description="beams of an eval generate")
    max_grad_norm: float = Field(1.0, ge=0, description="gradient clipping without DeepSpeed (0: none), as the Trainer")
    lora: LoraSpec | None = Field(None, description="LoRA adapters every probe trains (None: a full fine-tune)")

    def label_length(self, max_length: int) -> int:
        return self.max_target_length or max_length

    def generation_length(self, max_length: int) -> int:
        return self.generation_max_length or self.label_length(max_length)


class BatchDims(_Strict):
    """One rank's micro batch as a probe builds it (``micro_batch_size`` rows): inputs padded to ``input_length``,
    seq2seq labels to ``target_length`` (None: a causal LM, whose labels are its inputs), the tokens its samples
    really hold, inputs only, padding excluded (None where not counted: a worst batch), and whether any row is
    padded (its attention mask then marks the padding, as the user's collator does)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input_length: int = Field(ge=1)
    target_length: int | None = Field(None, ge=1)
    real_tokens: int | None = Field(None, ge=0)
    # a row shorter than input_length is padded by the collator, so its attention mask holds zeros: a causal LM then
    # builds its [batch, 1, len, len] mask (an all-ones mask lets transformers skip it for SDPA's is_causal)
    padded: bool = False


class DataBatches(_Strict):
    """The batches a probe of a job with data runs (tuner.probing.batches draws them from the user's lengths under
    their collator's padding): the memory window at ``worst`` on every rank (each rank's worst case is its own batch
    of the longest samples), the eval forward / generate at ``eval_worst`` (the eval set's worst batch), and the timed
    steps on ``timed[rank][step]``: each rank its own micro batch drawn from seeded shuffled epochs, as their
    DistributedSampler draws (a probe with more timed steps than drawn cycles through them)."""

    worst: BatchDims
    eval_worst: BatchDims | None = None
    timed: list[list[BatchDims]] = Field(min_length=1)
    seed: int = 0
    padding: str = "longest"

    def timed_for(self, rank: int) -> list[BatchDims]:
        return self.timed[rank % len(self.timed)]


def probe_accum(gradient_accumulation_steps: int) -> int:
    """The accumulation a probe runs (the runner composes the real cycle from its plain and boundary steps)."""
    return min(gradient_accumulation_steps, 2)


def timed_micro_steps(measure_steps: int, gradient_accumulation_steps: int) -> int:
    """How many micro-steps a probe's timed window runs: whole accumulation cycles covering ``measure_steps``."""
    accum = probe_accum(gradient_accumulation_steps)
    return math.ceil(max(measure_steps, accum) / accum) * accum


class ProbeConfig(_Strict):
    model: ModelSpec = Field(default_factory=ModelSpec)
    knobs: Knobs
    job: JobSettings = Field(default_factory=JobSettings)
    # The DeepSpeed JSON the user runs with these knobs (engine deepspeed): tuner.interop.export.to_deepspeed of the
    # knobs and the user's own DeepSpeed settings, the one function the export uses too. The probe runs it as is but
    # for trials.engine.probe_deepspeed_config's documented adaptations (its accumulation, no profiler files ...).
    deepspeed: dict[str, Any] | None = None
    world_size: int = Field(1, ge=1)
    gradient_accumulation_steps: int = Field(1, ge=1)
    warmup_steps: int = Field(2, ge=1, description="micro-steps before measuring, at least one optimizer step")
    measure_steps: int = Field(4, ge=1, description="measured micro-steps; the window holds an optimizer step")
    device_memory: int | None = Field(None, ge=1, description="bytes of device memory per rank; None = the device's")
    timeout_s: float = Field(300.0, gt=0)
    busy_bytes: int = Field(DEVICE_BUSY_BYTES, ge=0, description="device used at rank start above this: device-busy")
    seed: int = 0
    learning_rate: float = 1e-4
    # the user's data (--dataset): memory at its worst batch, throughput on batches drawn from it; None: every step
    # at the fixed shape (knobs.max_length, job.label_length)
    batches: DataBatches | None = None

    @property
    def global_batch(self) -> int:
        return self.knobs.micro_batch_size * self.gradient_accumulation_steps * self.world_size


#: the phases a probe measures a peak of (RankMemory.phases), in order
MEMORY_PHASES = ("train", "eval_forward", "generate")


#: the stage of a train step an allocation was asked for in (trials.memory.LiveTensorTracker)
Stage = Literal["forward", "backward", "optimizer step"]
FAILED_OP_CHARS = 120  # a failed allocation's op name is kept to this many characters (the stored row stays small)
FAILED_SHAPE_DIMS = 8


class FailedAllocation(_Strict):
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


class RankMemory(_Strict):
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


class StepStats(_Strict):
    micro_mean_s: float  # a forward+backward micro-step without optimizer step
    micro_p50_s: float
    micro_max_s: float
    optimizer_step_s: float  # a micro-step that ends with the optimizer step (boundary)
    cycle_s: float  # one full accumulation cycle: (accum - 1) * micro + boundary


class RankResult(_Strict):
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
    phase: Phase | None = None  # where a failed rank was when it failed
    # the rank could not use its device because of how it was launched (forked from a process that had initialised
    # CUDA): no verdict on the config; the runner runs it again in a fresh interpreter
    launch_fault: bool = False
    # with DataBatches: the shapes this rank built, read back from its tensors (the memory window's, then each timed
    # step's in order); empty at a fixed shape
    memory_shape: BatchDims | None = None
    timed_shapes: list[BatchDims] = Field(default_factory=list)


class RankReason(_Strict):
    """Why a rank ended without its result file, in its own words: written (atomically, once) by the rank's hooks
    (trials.last_words) at ``reason_path`` of its result, the moment it knows. The runner reads it before the rank's
    exit code; only a rank that could say nothing (SIGKILL, an abort inside a C++ library) is read from its stderr."""

    rank: int
    status: RankStatus
    cause: str
    source: Literal["exception", "signal", "thread", "result-write"]  # which hook spoke: see trials.last_words
    phase: Phase | None = None
    launch_fault: bool = False  # as RankResult.launch_fault


class ProbeResult(_Strict):
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
    attempts: int = 1  # launches it took: a transient failure (an outside kill, a launch failure) is retried once

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
