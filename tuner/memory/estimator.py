"""Peak device memory per rank for a config, without running it.

peak ~= model states (params, grads, optimizer; DeepSpeed's ZeRO arithmetic per stage / offload / world size)
      + ZeRO buffers (reduce / all-gather buckets)
      + activations and temporaries of one forward+backward (from a FakeTensorMode trace, see trials/estimate.py)

then calibrated against the probes measured so far (CUDA context, allocator slack, buffers the formulas miss): a
least-squares fit of ``measured ~= a * (states + buffers) + b * activations + c``, pulled towards (1, 1, 0) so one or
two probes move it gently. Pure: no torch import; the trace runs in a subprocess (:func:`trace`).

Model-state bytes per parameter (P params, N ranks; "mixed" = bf16/fp16, whose optimizer keeps an fp32 master copy;
DeepSpeed's ZeRO optimizers clone an fp32 partition even in fp32 training):

======= ================ ================ ==================================================
stage   params           grads            optimizer (Adam m, v [+ fp32 copy])
======= ================ ================ ==================================================
torch   4P               4P               8P (autocast keeps fp32 weights)
0       w P              w P              8P fp32, 12P mixed
1       w P              w P              12P / N
2       w P              w P / N          12P / N
3       w P / N + gather w P / N          12P / N
======= ================ ================ ==================================================

w = 2 for bf16/fp16, 4 for fp32. A LoRA job (trainable T < P: adapters on a frozen base) keeps the params column
at P (the base weights once, at the job's precision) and charges the grads and optimizer columns, and the ZeRO-1/2
all-gather, T instead of P: only the adapters get grads and optimizer states. offload_optimizer moves the optimizer
column to host memory. ZeRO with
contiguous_gradients (stage 1 or 2) keeps a reduce bucket of ``reduce_bucket_size`` elements (two with overlap_comm),
whatever the model size (DeepSpeed 0.19 ``setup_buckets``); ZeRO-1/2
all-gather updated params in chunks of at most ``allgather_bucket_size`` elements; ZeRO-3 gathers the largest layer.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from trials.contract import DS_DEFAULT_BUCKET, Knobs, LoraSpec, ModelSpec
from tuner.errors import ConfigError, ModelSourceError
from tuner.job.batching import accumulation_steps

MiB = 1 << 20


# -- what the trace reports (trials/estimate.py writes exactly this JSON) -------------------------------------------
class TracePoint(BaseModel):
    model_config = ConfigDict(extra="forbid")
    micro_batch_size: int = Field(ge=1)
    max_length: int = Field(ge=1)
    gradient_checkpointing: bool = False
    precision: str = "fp32"
    activation_bytes: int = 0  # fwd+bwd peak above params + full grads + optimizer state, grads built during it
    resident_activation_bytes: int | None = None  # the same with the grads resident (an accumulation micro-step)
    step_temp_bytes: int = 0  # optimizer-step temporaries above params + grads + state
    peak_bytes: int = 0  # the traced plain-torch step's peak (what engine "torch" needs)


class Trace(BaseModel):
    model_config = ConfigDict(extra="forbid")
    param_count: int
    trainable_count: int | None = None  # params that train (a LoRA job's adapters); None: all (older traces)
    param_bytes: int  # as built (fp32)
    largest_param: int  # elements of the largest parameter tensor (ZeRO-3 gathers at least this)
    points: list[TracePoint] = Field(default_factory=list)
    trace_s: float = 0.0

    def find(self, micro: int, length: int, ckpt: bool, precision: str) -> TracePoint | None:
        for p in self.points:
            if (p.micro_batch_size, p.max_length, p.gradient_checkpointing, p.precision) == (
                micro,
                length,
                ckpt,
                precision,
            ):
                return p
        return None


# -- model states ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StateBytes:
    params: int
    grads: int
    optimizer: int
    buffers: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.buffers


def model_state_bytes(
    knobs: Knobs,
    param_count: int,
    world_size: int = 1,
    largest_param: int | None = None,
    trainable: int | None = None,
) -> StateBytes:
    """DeepSpeed's model-state arithmetic (see the module docstring) for one rank; ``trainable``: the params that
    get grads and optimizer states (a LoRA job's adapters; None: all ``param_count``)."""
    if world_size < 1:
        raise ConfigError(f"world size {world_size} must be at least 1")
    p, n = param_count, world_size
    t = p if trainable is None else min(trainable, p)
    mixed = knobs.precision in ("bf16", "fp16")
    if knobs.engine == "torch":
        return StateBytes(params=4 * p, grads=4 * t, optimizer=8 * t, buffers=0)
    w = 2 if mixed else 4
    stage = knobs.zero_stage
    params = w * p if stage < 3 else math.ceil(w * p / n)
    grads = w * t if stage < 2 else math.ceil(w * t / n)
    if stage == 0:
        optimizer = (12 if mixed else 8) * t
    else:
        optimizer = math.ceil(12 * t / n)
    if knobs.offload_optimizer:
        optimizer = 0
    reduce = knobs.reduce_bucket_size or DS_DEFAULT_BUCKET
    allgather = knobs.allgather_bucket_size or DS_DEFAULT_BUCKET
    buffers = 0
    if stage in (1, 2):
        buffers += w * min(allgather, t)  # all-gather of the updated partitions, in chunks
        if knobs.contiguous_gradients:  # DeepSpeed 0.19 allocates the full bucket (stage 1: an fp32 accumulator)
            buffers += (4 if stage == 1 else w) * reduce * (2 if knobs.overlap_comm else 1)
        else:
            buffers += w * min(reduce, t)
    elif stage == 3:
        buffers += w * max(largest_param or 0, min(allgather, p))  # gathered layer / prefetch
        buffers += w * min(reduce, t) * (2 if knobs.overlap_comm else 1)
    return StateBytes(params=params, grads=grads, optimizer=optimizer, buffers=buffers)


def zero_order_sound(param_count: int, world_size: int, space_knobs: list[Knobs]) -> bool:
    """True when, by the model-state arithmetic, every higher ZeRO stage needs no more than a lower one for every
    config of ``space_knobs`` (same knobs otherwise) — the condition for ``Frontier(zero_order=True)``."""
    for k in space_knobs:
        if k.engine != "deepspeed":
            continue
        for hi in range(k.zero_stage + 1, 4):
            other = k.model_copy(update={"zero_stage": hi})
            if (
                model_state_bytes(other, param_count, world_size).total
                > model_state_bytes(k, param_count, world_size).total
            ):
                return False
    return True


def zero_stage_need(
    param_count: int,
    world_size: int,
    space_knobs: list[Knobs],
    largest_param: int | None = None,
    trainable: int | None = None,
) -> dict[int, int] | None:
    """The order of ZeRO stages by memory need for this model, world size and space — ``Frontier(stage_need=...)`` —
    or None when no single order holds for every config of the space.

    Stages are ranked by their mean model-state bytes; the order is returned only if, for every pair of the space's
    configs that the frontier would compare under it, the one it says needs more has at least the model-state bytes
    of the other (activations do not depend on the stage).
    """
    from tuner.memory.frontier import DEFAULT_ORDER, needs_at_least

    totals: dict[tuple[Any, ...], tuple[dict[str, Any], int]] = {}
    for k in space_knobs:
        if k.engine != "deepspeed":
            continue
        sig = (
            k.zero_stage,
            k.precision,
            k.offload_optimizer,
            k.reduce_bucket_size,
            k.allgather_bucket_size,
            k.overlap_comm,
            k.contiguous_gradients,
        )
        if sig not in totals:
            base = k.model_copy(
                update={
                    "micro_batch_size": 1,
                    "max_length": 1,
                    "gradient_checkpointing": False,
                    "eval_batch_size": None,
                    "generate": False,
                    "alloc_conf": None,
                }
            )
            states = model_state_bytes(k, param_count, world_size, largest_param, trainable)
            totals[sig] = (base.model_dump(), states.total)
    stages = sorted({sig[0] for sig in totals})
    if len(stages) < 2:
        return None
    mean = {
        s: sum(t for sig, (_, t) in totals.items() if sig[0] == s) / sum(1 for sig in totals if sig[0] == s)
        for s in stages
    }
    ranked = sorted(set(mean.values()))
    need = {s: ranked.index(mean[s]) for s in stages}
    order = {**DEFAULT_ORDER, "zero_stage": "rank"}
    items = list(totals.values())
    for a, ta in items:
        for b, tb in items:
            if a["zero_stage"] != b["zero_stage"] and needs_at_least(a, b, order, need) and ta < tb:
                return None
    return need


# -- the estimate ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Estimate:
    states: StateBytes
    activations: int  # activations + temporaries of the step (the larger of fwd/bwd and optimizer-step temporaries)
    raw: int  # states + activations, uncalibrated
    calibrated: int  # after the fit against measured probes (== raw with no measurement)
    calibration: tuple[float, float, float]

    def fits(self, capacity: int, margin: float = 0.0) -> bool:
        return self.calibrated * (1.0 - margin) <= capacity


@dataclass
class Estimator:
    """Predicts peaks from a trace, and recalibrates on every measured peak (``observe``)."""

    trace: Trace
    world_size: int = 1
    global_batch: int | None = None  # with it, configs that do not accumulate gradients are not charged resident grads
    prior_weight: float = 0.05  # how strongly the fit is pulled towards (1, 1, 0): a fraction of one probe
    observations: list[tuple[dict[str, Any], int]] = field(default_factory=list)
    _theta: tuple[float, float, float] = (1.0, 1.0, 0.0)

    def accumulates(self, knobs: Knobs) -> bool:
        """Whether a step of this config runs several micro-steps (then the earlier micro-steps' grads are resident
        while the later ones peak). Unknown global batch: assumed so, the larger need."""
        if self.global_batch is None:
            return True
        return (accumulation_steps(self.global_batch, knobs.micro_batch_size, self.world_size) or 2) > 1

    def activation_bytes(self, knobs: Knobs) -> int:
        """Traced bytes at this point, or an interpolation over the traced points of the same checkpointing/precision
        (activations grow like micro x (a*len + b*len^2)). With gradient accumulation, the peak with the grads
        resident (traces older than that field fall back to the plain peak)."""
        resident = self.accumulates(knobs)

        def need(p: TracePoint) -> int:
            act = (
                p.resident_activation_bytes
                if resident and p.resident_activation_bytes is not None
                else p.activation_bytes
            )
            return max(act, p.step_temp_bytes)

        hit = self.trace.find(knobs.micro_batch_size, knobs.max_length, knobs.gradient_checkpointing, knobs.precision)
        if hit is not None:
            return need(hit)
        same = [
            p
            for p in self.trace.points
            if p.gradient_checkpointing == knobs.gradient_checkpointing and p.precision == knobs.precision
        ]
        if not same:
            raise ConfigError(
                "the trace has no point with gradient_checkpointing="
                f"{knobs.gradient_checkpointing} precision={knobs.precision}; trace one first"
            )
        a, b = _fit_length_curve([(p.max_length, need(p) / p.micro_batch_size) for p in same])
        s = knobs.max_length
        return max(0, int(knobs.micro_batch_size * (a * s + b * s * s)))

    def states(self, knobs: Knobs) -> StateBytes:
        tr = self.trace
        return model_state_bytes(knobs, tr.param_count, self.world_size, tr.largest_param, tr.trainable_count)

    def predict(self, knobs: Mapping[str, Any] | Knobs) -> Estimate:
        k = knobs if isinstance(knobs, Knobs) else Knobs.model_validate(dict(knobs))
        states = self.states(k)
        act = self.activation_bytes(k)
        a, b, c = self._theta
        calibrated = int(a * states.total + b * act + c)
        return Estimate(
            states=states, activations=act, raw=states.total + act, calibrated=calibrated, calibration=self._theta
        )

    def observe(self, knobs: Mapping[str, Any] | Knobs, measured_peak: int) -> None:
        """Adds a measured peak (bytes, the max over ranks) and refits the calibration."""
        k = knobs if isinstance(knobs, Knobs) else Knobs.model_validate(dict(knobs))
        self.observations.append((k.model_dump(), int(measured_peak)))
        self._refit()

    def _refit(self) -> None:
        # relative errors (small and large configs count alike); the intercept in units of the median measured peak
        unit = float(sorted(m for _, m in self.observations)[len(self.observations) // 2] or 1)
        rows: list[tuple[list[float], float]] = []
        for kd, measured in self.observations:
            k = Knobs.model_validate(kd)
            states = self.states(k).total
            act = self.activation_bytes(k)
            scale = float(max(measured, 1))
            rows.append(([states / scale, act / scale, unit / scale], measured / scale))
        # ridge towards theta0 = (1, 1, 0): minimise |X t - y|^2 + w |t - theta0|^2
        w = self.prior_weight
        theta0 = [1.0, 1.0, 0.0]
        ata = [[w if i == j else 0.0 for j in range(3)] for i in range(3)]
        aty = [w * theta0[i] for i in range(3)]
        for x, y in rows:
            for i in range(3):
                aty[i] += x[i] * y
                for j in range(3):
                    ata[i][j] += x[i] * x[j]
        t = _solve3(ata, aty)
        self._theta = (max(t[0], 0.0), max(t[1], 0.0), t[2] * unit)

    def errors(self) -> list[float]:
        """Relative errors (predicted / measured - 1) of the current calibration on the observed probes."""
        out = []
        for kd, measured in self.observations:
            out.append(self.predict(kd).calibrated / max(measured, 1) - 1.0)
        return out


def _fit_length_curve(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Fits per-sample bytes ~= a*len + b*len^2 (b >= 0) through the points; one length gives b = 0."""
    lengths = {s for s, _ in points}
    if len(lengths) == 1:
        s = points[0][0]
        return sum(v for _, v in points) / len(points) / s, 0.0
    s11 = sum(s * s for s, _ in points)
    s12 = sum(s**3 for s, _ in points)
    s22 = sum(s**4 for s, _ in points)
    y1 = sum(s * v for s, v in points)
    y2 = sum(s * s * v for s, v in points)
    det = s11 * s22 - s12 * s12
    a = (y1 * s22 - y2 * s12) / det
    b = (s11 * y2 - s12 * y1) / det
    if b < 0:
        return y1 / s11, 0.0
    return a, b


def _solve3(m: list[list[float]], v: list[float]) -> list[float]:
    a = [[*row[:], v[i]] for i, row in enumerate(m)]
    for c in range(3):
        piv = max(range(c, 3), key=lambda r: abs(a[r][c]))
        a[c], a[piv] = a[piv], a[c]
        for r in range(3):
            if r != c and a[c][c]:
                f = a[r][c] / a[c][c]
                a[r] = [x - f * y for x, y in zip(a[r], a[c], strict=False)]
    return [a[i][3] / a[i][i] if a[i][i] else 0.0 for i in range(3)]


# -- running the trace (a subprocess: tuner/ never imports torch) ---------------------------------------------------
def trace(
    model: ModelSpec,
    points: Sequence[tuple[int, int, bool, str]],
    timeout_s: float = 600.0,
    python: str | None = None,
    label_length: int | None = None,
    lora: LoraSpec | None = None,
) -> Trace:
    """Traces one training step per (micro, max_length, checkpointing, precision) on CPU fake tensors; seq2seq
    labels at ``label_length`` (the job's; None: max_length), as the probe pads them; with the job's ``lora``
    adapters on the model as every probe of a LoRA job runs it."""
    request = {
        "model": model.model_dump(),
        "label_length": label_length,
        "lora": lora.model_dump(mode="json") if lora is not None else None,
        "points": [
            {"micro_batch_size": m, "max_length": s, "gradient_checkpointing": c, "precision": p}
            for m, s, c, p in points
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
