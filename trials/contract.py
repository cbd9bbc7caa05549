"""The probe contract: what tuner/ sends to one probe (ProbeConfig) and, re-exported from its two halves, what comes
back (trials.contract_result) and the batch shapes (trials.contract_batches).

This is the only module of ``trials`` that ``tuner`` imports. It has no torch import: the search, the API and the
exports all read these models without loading a training stack. Everything both sides of the process boundary must
agree on is defined here once: the models, the exit codes, the environment the runner sets, where each rank writes its
result, the fork server's ready line, the op libraries, and the DeepSpeed defaults a probe runs with.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer, model_validator

# The contract's other halves, re-exported: tuner/ imports the contract from this module alone.
from trials.contract_batches import BatchDims, DataBatches, Strict, probe_accum, timed_micro_steps  # noqa: F401
from trials.contract_job import DpoSpec, FsdpSettings, FsdpWrap, JobSettings, LoraBias, LoraSpec, TrlHead  # noqa: F401
from trials.contract_nodes import (  # noqa: F401
    NODE_KNOBS,
    ZERO_PP_KNOBS,
    drop_unset,
    layout_refusal,
    node_knobs_refusal,
    zero_pp_label,
)
from trials.contract_pinned import (  # noqa: F401
    DEFAULT_PINNED_ALLOC,
    PINNED_ALLOC_ENV,
    PINNED_ALLOCS,
    parse_pinned_alloc,
    pinned_alloc_text,
    register_threads,
)
from trials.contract_result import (  # noqa: F401
    DEVICE_BUSY_BYTES,
    FAILED_OP_CHARS,
    FAILED_SHAPE_DIMS,
    MEMORY_PHASES,
    FailedAllocation,
    Phase,
    ProbeNode,
    ProbeResult,
    RankMemory,
    RankReason,
    RankResult,
    Stage,
    StepStats,
    device_busy,
    memory_need,
)
from trials.status import (  # noqa: F401  (re-exported: the contract's status vocabulary)
    EXIT_BUSY,
    EXIT_CODES,
    EXIT_ERROR,
    EXIT_HOST_OOM,
    EXIT_KILLED,
    EXIT_OK,
    EXIT_OOM,
    EXIT_REFUSED,
    EXIT_TIMEOUT,
    RankStatus,
    Status,
)

Precision = Literal["fp32", "bf16", "fp16"]
Engine = Literal["torch", "deepspeed", "fsdp2"]
# The FSDP2 knobs (engine "fsdp2" only): a Knobs dump of another engine leaves them out, so the keys of configs stored
# before FSDP2 existed do not change (tuner.job.space.knobs_key / config_key hash the dump).
FSDP_KNOBS: tuple[str, ...] = ("reshard_after_forward", "offload_params")

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
OP_LIBRARIES: dict[str, str] = {
    "cpu_adam": "cpu_adam",
    "shm_comm": "deepspeed_shm_comm",
    "fused_adam": "fused_adam",
    "quantizer": "quantizer",
}
# The ops (comma-separated keys) the fork server loads once at start, built already: each forked rank then finds them
# loaded (DeepSpeed keeps loaded ops per process) instead of importing them inside its fixed cost.
PRELOAD_OPS_ENV = "TUNER_PRELOAD_OPS"

# The user's consent to run code a model's or tokenizer's folder ships (its auto_map: transformers imports the folder's
# own module): `tuner --trust-remote-code COMMAND` sets it for the command and every process it starts (probes, traces,
# op builds); without it every from_pretrained / from_config passes trust_remote_code=False and tuner refuses such a
# folder in one line first (tuner.job.own_code). Never set by the API server, which loads no model.
TRUST_REMOTE_CODE_ENV = "TUNER_TRUST_REMOTE_CODE"


def trusts_remote_code(env: Mapping[str, str]) -> bool:
    """Whether ``env`` carries the user's consent (``TRUST_REMOTE_CODE_ENV``: 1 / true / yes / on)."""
    return env.get(TRUST_REMOTE_CODE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


# The DeepSpeed bucket knobs, and DeepSpeed's default (elements) that a probe runs with when a bucket knob is unset
# (None): the export writes it, the estimate and the feasibility frontier assume it.
BUCKET_KNOBS: tuple[str, str] = ("allgather_bucket_size", "reduce_bucket_size")
DS_DEFAULT_BUCKET = 500_000_000

# The tokens a memory trace decodes at most (trials.decode.traced_decode; the rest of a longer decode extrapolated
# from the last ones); tuner.memory.trace_run weighs a point's decode by it.
TRACED_DECODE_STEPS = 24

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


class Knobs(Strict):
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
    # ZeRO-3's parameter offload (zero_optimization.offload_param.device cpu): the partitioned parameters live in host
    # memory, gathered to the device for each module's forward / backward (written to a dump only when on)
    offload_param: bool = False
    gradient_checkpointing: bool = False
    precision: Precision = "fp32"
    alloc_conf: str | None = None
    eval_batch_size: int | None = Field(None, ge=1)
    generate: bool = False
    # FSDP2 (engine "fsdp2"): free each block's gathered parameters after its forward (accelerate's
    # fsdp_reshard_after_forward; False keeps them to the backward: less communication, more memory) and CPU offload
    # of the sharded parameters, their gradients and the optimizer step (fsdp_offload_params: CPUOffloadPolicy)
    reshard_after_forward: bool = True
    offload_params: bool = False
    # across nodes (NODE_KNOBS): ZeRO++ of ZeRO-3, FSDP2's replicate degree (None / 1: no ZeRO++, no replicas)
    zero_hpz_partition_size: int | None = Field(None, ge=1)
    zero_quantized_weights: bool = False
    zero_quantized_gradients: bool = False
    dp_replicate_size: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _consistent(self) -> Knobs:
        refused = node_knobs_refusal(self)
        if refused:
            raise ValueError(refused)
        if self.engine == "torch" and (self.zero_stage or self.offload_optimizer):
            raise ValueError("engine 'torch' has no ZeRO stage or optimizer offload; use engine 'deepspeed'")
        if self.offload_optimizer and self.zero_stage == 0:
            raise ValueError("offload_optimizer needs zero_stage >= 1")
        if self.offload_param and (self.engine != "deepspeed" or self.zero_stage != 3):
            raise ValueError("offload_param is ZeRO-3's parameter offload; use engine 'deepspeed' with zero_stage 3")
        if self.engine == "fsdp2":
            deepspeed_only = self.zero_stage or self.offload_optimizer or self.overlap_comm
            if deepspeed_only or self.allgather_bucket_size or self.reduce_bucket_size:
                raise ValueError(
                    "engine 'fsdp2' has no ZeRO stage, DeepSpeed buckets, overlap_comm or optimizer offload; "
                    "its offload is offload_params (parameters, gradients and the optimizer step on the host)"
                )
        elif not self.reshard_after_forward or self.offload_params:
            raise ValueError("reshard_after_forward and offload_params are FSDP2 knobs; use engine 'fsdp2'")
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """The FSDP knobs only in an FSDP2 config's dump (another engine's keys stay as they were before FSDP2)."""
        data: dict[str, Any] = handler(self)
        if self.engine != "fsdp2":
            for name in FSDP_KNOBS:
                data.pop(name, None)
        drop_unset(data)  # the across-node knobs only where set: every other config's keys stay as they were
        if not self.offload_param:  # likewise ZeRO-3's parameter offload (configs stored before it keep their keys)
            data.pop("offload_param", None)
        return data

    @property
    def engine_label(self) -> str:
        """The engine in a few words: "ZeRO-2", "torch", "FSDP2 resharded" / "FSDP2 kept gathered" (+ ", offload
        params")."""
        if self.engine == "fsdp2":
            held = "resharded" if self.reshard_after_forward else "kept gathered"
            hsdp = f", HSDP x{self.dp_replicate_size}" if (self.dp_replicate_size or 1) > 1 else ""
            return f"FSDP2 {held}" + (", offload params" if self.offload_params else "") + hsdp
        if self.engine == "torch":
            return self.engine
        return f"ZeRO-{self.zero_stage}{zero_pp_label(self)}" + (", offload params" if self.offload_param else "")

    @property
    def sharded(self) -> bool:
        """Whether parameters are sharded over the ranks (ZeRO-3 or FSDP2)."""
        return self.engine == "fsdp2" or (self.engine == "deepspeed" and self.zero_stage == 3)


class ModelSpec(Strict):
    """Where the model comes from.

    ``source`` is ``builtin:<preset>`` (random init from a T5Config, no download: ``builtin:tiny-t5``,
    ``builtin:t5-small``, ``builtin:flan-t5-large``), an HF hub id, or a local ``save_pretrained`` directory.
    ``overrides`` adjust a built-in preset's config fields (``d_model``, ``num_layers`` ...).
    """

    source: str = "builtin:tiny-t5"
    overrides: dict[str, int | float | str] = Field(default_factory=dict)
    vocab_size: int | None = None  # filled by the probe from the model's config


class ProbeConfig(Strict):
    model: ModelSpec = Field(default_factory=ModelSpec)
    knobs: Knobs
    job: JobSettings = Field(default_factory=JobSettings)
    # The DeepSpeed JSON the user runs with these knobs (engine deepspeed): tuner.interop.export.to_deepspeed of the
    # knobs and the user's own DeepSpeed settings, the one function the export uses too. The probe runs it as is but
    # for trials.engine.probe_deepspeed_config's documented adaptations (its accumulation, no profiler files ...).
    deepspeed: dict[str, Any] | None = None
    # the user's FSDP2 settings (engine fsdp2; None: accelerate's defaults), held as they are
    fsdp: FsdpSettings | None = None
    world_size: int = Field(1, ge=1)
    # the nodes the world spans (world_size / nnodes ranks on each, started by torchrun's c10d rendezvous: tuner.nodes)
    nnodes: int = Field(1, ge=1)
    gradient_accumulation_steps: int = Field(1, ge=1)
    warmup_steps: int = Field(2, ge=1, description="micro-steps before measuring, at least one optimizer step")
    measure_steps: int = Field(4, ge=1, description="measured micro-steps; the window holds an optimizer step")
    # the timed window at a fixed shape stops once its cycles agree within timing_tolerance (their spread: (max - min)
    # / median of the last ``min`` cycles), or at max_measure_steps (None: 2 x measure_steps) whatever the spread,
    # which it reports; never past half its timeout (the search sizes timeouts on probes of the minimum length)
    timing_tolerance: float = Field(0.05, ge=0, description="relative spread of cycle times the search can tell apart")
    max_measure_steps: int | None = Field(None, ge=1, description="measured micro-steps at most; None: 2 x measure")
    device_memory: int | None = Field(None, ge=1, description="bytes of device memory per rank; None = the device's")
    timeout_s: float = Field(300.0, gt=0)
    busy_bytes: int = Field(DEVICE_BUSY_BYTES, ge=0, description="device used at rank start above this: device-busy")
    seed: int = 0
    learning_rate: float = 1e-4
    # the user's data (--dataset): memory at its worst batch, throughput on batches drawn from it; None: every step
    # at the fixed shape (knobs.max_length, job.label_length)
    batches: DataBatches | None = None

    @model_validator(mode="after")
    def _layout(self) -> ProbeConfig:
        """The world is whole nodes, and the across-node knobs divide it as their engine requires."""
        refused = layout_refusal(self.world_size, self.nnodes, self.knobs)
        if refused:
            raise ValueError(refused)
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """``nnodes`` only for a probe across nodes (a one-host probe's JSON stays as it was)."""
        data: dict[str, Any] = handler(self)
        if data.get("nnodes") == 1:
            data.pop("nnodes")
        return data

    @property
    def nproc_per_node(self) -> int:
        return self.world_size // self.nnodes

    @property
    def global_batch(self) -> int:
        return self.knobs.micro_batch_size * self.gradient_accumulation_steps * self.world_size


_ADAM_TYPES = {"adam", "adamw"}


def needed_ops(config: ProbeConfig, gpu_host: bool) -> list[str]:
    """The JIT ops a probe of ``config`` loads: cpu_adam for an offloaded optimizer; on a GPU host, fused_adam for the
    user's Adam/AdamW optimizer section on the device (DeepSpeed's FusedAdam); on a host without GPUs, shm_comm
    (DeepSpeed's CPU accelerator loads it in init_distributed; its CUDA accelerator never builds it)."""
    knobs = config.knobs
    if knobs.engine != "deepspeed":
        return []
    optimizer = (config.deepspeed or {}).get("optimizer") or {}
    adam = str(optimizer.get("type", "")).lower() in _ADAM_TYPES
    torch_adam = bool((optimizer.get("params") or {}).get("torch_adam"))
    ops = ["cpu_adam"] if knobs.offload_optimizer else []
    if gpu_host and adam and not knobs.offload_optimizer and not torch_adam:
        ops.append("fused_adam")
    if gpu_host and (knobs.zero_quantized_weights or knobs.zero_quantized_gradients):
        ops.append("quantizer")  # ZeRO++'s int8 / int4 kernels
    if not gpu_host:
        ops.append("shm_comm")
    return ops
