"""What the fake-tensor trace reports (trials/estimate.py writes exactly this JSON), and running it in a subprocess
(tuner/ never imports torch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from trials.contract import FsdpSettings, Knobs, LoraSpec, ModelSpec
from tuner.errors import ConfigError, ModelSourceError
from tuner.memory.precision import traced_precision

#: one traced shape: (micro batch, max_length, gradient checkpointing, precision, cast_module); cast_module: the
#: module itself in the half precision (DeepSpeed bf16/fp16), else fp32 weights under autocast (tuner.memory.precision)
TraceAt = tuple[int, int, bool, str, bool]


def trace_at(knobs: Knobs, micro: int | None = None, length: int | None = None) -> TraceAt:
    """The traced shape of a config, in the precision mode its engine runs (at ``micro`` / ``length`` if given)."""
    return (
        knobs.micro_batch_size if micro is None else micro,
        knobs.max_length if length is None else length,
        knobs.gradient_checkpointing,
        knobs.precision,
        traced_precision(knobs).cast_module,
    )


#: one traced FSDP2 config: (micro batch, max_length, checkpointing, precision, reshard_after_forward,
#: offload_params, world size, accumulates): FSDP2's memory depends on all of them (trials.trace_fsdp)
FsdpAt = tuple[int, int, bool, str, bool, bool, int, bool]


def fsdp_at(
    knobs: Knobs, world_size: int, accumulates: bool, micro: int | None = None, length: int | None = None
) -> FsdpAt:
    """The traced FSDP2 config of ``knobs`` (at ``micro`` / ``length`` if given)."""
    return (
        knobs.micro_batch_size if micro is None else micro,
        knobs.max_length if length is None else length,
        knobs.gradient_checkpointing,
        knobs.precision,
        knobs.reshard_after_forward,
        knobs.offload_params,
        world_size,
        accumulates,
    )


class TracedAllocation(BaseModel):
    """One of the largest storages a traced phase created: the op that asked for it, its shape, dtype and bytes."""

    model_config = ConfigDict(extra="forbid")
    op: str
    shape: list[int]
    dtype: str
    nbytes: int


class Evaluation(BaseModel):
    """What the job's evaluation runs (the trace's eval phases): the eval batch, and a generate of
    ``generation_max_length`` new tokens (None: the label length) over ``num_beams`` beams."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    eval_batch_size: int = Field(ge=1)
    generate: bool = False
    generation_max_length: int | None = Field(None, ge=1)
    num_beams: int = Field(1, ge=1)


class TracePoint(BaseModel):
    model_config = ConfigDict(extra="forbid")
    micro_batch_size: int = Field(ge=1)
    max_length: int = Field(ge=1)
    gradient_checkpointing: bool = False
    precision: str = "fp32"
    # bf16/fp16 run as DeepSpeed runs them (the module cast; True) or as the plain torch engine (fp32 weights under
    # autocast; False); None: traced before the field (autocast, the only mode then)
    cast_module: bool | None = None
    activation_bytes: int = 0  # fwd+bwd peak above params + full grads + optimizer state, grads built during it
    resident_activation_bytes: int | None = None  # the same with the grads resident (an accumulation micro-step)
    # the two peaks above counted from the backward's first parameter grad on (when ZeRO-1/2's hooks allocate their
    # reduce buckets); None: traced before the field (read as the whole peak)
    after_grad_activation_bytes: int | None = None
    resident_after_grad_activation_bytes: int | None = None
    step_temp_bytes: int = 0  # optimizer-step temporaries above params + grads + state
    peak_bytes: int = 0  # the traced plain-torch step's peak (what engine "torch" needs)
    # the eval phases (traces with an Evaluation): peaks above params + optimizer state (no grads), batch included
    eval_batch_size: int | None = None
    eval_bytes: int | None = None  # the eval forward (no grad; loss and logits)
    generate_bytes: int | None = None  # a decode of every row to the generation length (trials.decode)
    generate_cache_bytes: int | None = None  # of which the generation (KV) cache at its largest
    # mixed precision: the low-precision copies of the weights torch.autocast keeps through a forward (and a train
    # step's backward saves): one per matmul weight, independent of batch and length; in every phase's bytes above.
    # A DeepSpeed bf16/fp16 engine runs a half-precision module without autocast and holds none. None: not traced.
    autocast_cache_bytes: int | None = None
    generation_length: int | None = None
    num_beams: int | None = None
    largest: dict[str, list[TracedAllocation]] = Field(default_factory=dict)  # phase -> its largest allocations


class FsdpPoint(BaseModel):
    """One FSDP2 config traced as its probe runs it (trials.trace_fsdp: rank 0 of a fake process group of the world
    size, fake tensors, the emulated device's tracker), in bytes per rank; the phases above ``states_bytes``."""

    model_config = ConfigDict(extra="forbid")
    micro_batch_size: int = Field(ge=1)
    max_length: int = Field(ge=1)
    gradient_checkpointing: bool = False
    precision: str = "fp32"
    reshard_after_forward: bool = True
    offload_params: bool = False
    world_size: int = Field(ge=1)
    accumulates: bool = False  # the step runs 2 micro-steps (no_sync keeps unsharded grads between them)
    refused: str | None = None  # the model cannot be sharded (trials.fsdp.FsdpRefusal): the reason, no bytes
    states_bytes: int = 0  # live at a steady cycle's start: parameter shards + optimizer state on the device
    param_shard_bytes: int = 0  # of which the parameter shards (0 under offload_params: on the host)
    forward_backward_bytes: int = 0  # the cycle's forward+backward peak above the states
    gathered_bytes: int = 0  # of which FSDP2's unsharded (all-gathered) parameters live at that peak
    step_bytes: int = 0  # the optimizer step's peak above the states (grads, clipping and AdamW's temporaries)
    eval_batch_size: int | None = None
    eval_bytes: int | None = None  # the eval forward's peak above the states (the train batch still held)
    generate_bytes: int | None = None  # a decode to the generation length (trials.decode)
    generate_cache_bytes: int | None = None
    generation_length: int | None = None
    num_beams: int | None = None

    def at(self) -> FsdpAt:
        return (
            self.micro_batch_size,
            self.max_length,
            self.gradient_checkpointing,
            self.precision,
            self.reshard_after_forward,
            self.offload_params,
            self.world_size,
            self.accumulates,
        )


class Trace(BaseModel):
    model_config = ConfigDict(extra="forbid")
    param_count: int
    trainable_count: int | None = None  # params that train (a LoRA job's adapters); None: all (older traces)
    param_bytes: int  # as built (fp32)
    largest_param: int  # elements of the largest parameter tensor (ZeRO-3 gathers at least this)
    points: list[TracePoint] = Field(default_factory=list)
    fsdp_points: list[FsdpPoint] = Field(default_factory=list)  # FSDP2 configs (trials.trace_fsdp); none before
    # whose kernels the trace ran where their memory differs: "cpu" (the emulated device's probes) or "cuda" (fused
    # dropout, the math path of attention with a float bias: trials.trace_modes.cuda_kernels)
    kernels: str = "cpu"
    trace_s: float = 0.0

    def find(self, micro: int, length: int, ckpt: bool, precision: str, cast_module: bool = False) -> TracePoint | None:
        """The point of that shape and precision mode (a trace older than ``cast_module``: its autocast point)."""
        for p in self.points:
            if (p.micro_batch_size, p.max_length, p.gradient_checkpointing, p.precision) == (
                micro,
                length,
                ckpt,
                precision,
            ) and same_mode(p, cast_module):
                return p
        return None


def same_mode(point: TracePoint, cast_module: bool) -> bool:
    """Whether a traced point ran the precision mode wanted (fp32 points serve both; a point traced before the field
    ran autocast, the only mode then, and serves a cast module too: older stored traces read as before)."""
    return point.precision not in ("bf16", "fp16") or point.cast_module is None or point.cast_module == cast_module


def trace(
    model: ModelSpec,
    points: Sequence[TraceAt],
    timeout_s: float = 600.0,
    python: str | None = None,
    label_length: int | None = None,
    lora: LoraSpec | None = None,
    evaluation: Evaluation | None = None,
    padded: bool = False,
    kernels: str = "cpu",
    fsdp_points: Sequence[FsdpAt] = (),
    fsdp: FsdpSettings | None = None,
) -> Trace:
    """Traces one training step per (micro, max_length, checkpointing, precision, cast_module) (``trace_at``) on CPU
    fake tensors, in the precision mode of the engine (tuner.memory.precision); seq2seq
    labels at ``label_length`` (the job's; None: max_length), as the probe pads them; with the job's ``lora``
    adapters on the model as every probe of a LoRA job runs it; with ``evaluation`` the eval forward and generate
    of each point too; ``padded``: batches with the collator's padding (a job with data), as its probes run them;
    ``kernels``: "cuda" for a job that trains on a GPU (its kernels where their memory differs from the CPU's);
    ``fsdp_points``: FSDP2 configs (``fsdp_at``) run as their probe runs them, with the user's ``fsdp`` settings."""
    request = {
        "model": model.model_dump(),
        "label_length": label_length,
        "lora": lora.model_dump(mode="json") if lora is not None else None,
        "evaluation": evaluation.model_dump() if evaluation is not None else None,
        "padded": padded,
        "kernels": kernels,
        "points": [
            {"micro_batch_size": m, "max_length": s, "gradient_checkpointing": c, "precision": p, "cast_module": cast}
            for m, s, c, p, cast in points
        ],
        "fsdp": fsdp.model_dump(mode="json") if fsdp is not None else None,
        "fsdp_points": [
            {
                "micro_batch_size": m,
                "max_length": s,
                "gradient_checkpointing": c,
                "precision": p,
                "reshard_after_forward": raf,
                "offload_params": off,
                "world_size": n,
                "accumulates": acc,
            }
            for m, s, c, p, raf, off, n, acc in fsdp_points
        ],
    }
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    with tempfile.TemporaryDirectory(prefix="tuner-trace-") as tmp:
        out = Path(tmp) / "trace.json"
        cmd = [python or sys.executable, "-m", "trials.estimate", "--request", json.dumps(request), "--out", str(out)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, check=False)
        except subprocess.TimeoutExpired as exc:
            raise ConfigError(f"the memory trace took longer than {timeout_s:.0f} s; trace fewer points") from exc
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        if done.returncode == 3:
            raise ModelSourceError(last)
        if done.returncode != 0 or not out.exists():
            raise RuntimeError(f"trials.estimate exited {done.returncode}: {last}")
        return Trace.model_validate_json(out.read_text())
