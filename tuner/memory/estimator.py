"""Peak device memory per rank for a config, without running it.

peak ~= max over the step's phases (forward+backward, optimizer step) of
        model states (params, grads, optimizer; tuner.memory.states: DeepSpeed's ZeRO arithmetic)
      + the ZeRO buffers live in that phase (reduce / all-gather buckets, grad partition, offload staging)
      + that phase's activations and temporaries (from a FakeTensorMode trace, see trials/estimate.py)

(the phases and parts: tuner.memory.breakdown); an FSDP2 config is read from the trace of its own probe instead
(tuner.memory.fsdp); then calibrated against the probes measured so far (CUDA context,
allocator slack, buffers the formulas miss): a least-squares fit of ``measured ~= a * states + b * (peak - states)
+ c``, pulled towards (1, 1, 0) so one or two probes move it gently. Pure: no torch import; the trace runs in a
subprocess (tuner.memory.trace).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from trials.contract import Knobs
from tuner.job.batching import accumulation_steps
from tuner.memory.breakdown import (
    ACTIVATIONS,
    EVAL_FORWARD,
    FORWARD_BACKWARD,
    GENERATE,
    GENERATION_CACHE,
    GRADIENTS,
    NOT_COVERED,
    NOT_COVERED_COMPILED,
    OPTIMIZER,
    OPTIMIZER_STEP,
    PARAMETERS,
    ZERO_BUFFERS,
    Breakdown,
    Part,
    PhaseEstimate,
    RankEstimate,
)
from tuner.memory.fsdp import fsdp_phases, fsdp_states
from tuner.memory.fsdp import matching as fsdp_matching
from tuner.memory.reference import pairs_note, reference_parts, solve3
from tuner.memory.states import (
    PhaseBuffers,
    StateBytes,
    model_state_bytes,
    zero_buffers,
    zero_order_sound,
    zero_stage_need,
)
from tuner.memory.trace import (
    Evaluation,
    FsdpPoint,
    Trace,
    TracePoint,
    fsdp_at,
    same_mode,
    shard_world,
    trace,
    trace_at,
)
from tuner.memory.traced import named, traced

__all__ = [
    "Estimate",
    "Estimator",
    "Evaluation",
    "FsdpPoint",
    "StateBytes",
    "Trace",
    "TracePoint",
    "accumulates",
    "fsdp_at",
    "model_state_bytes",
    "trace",
    "trace_at",
    "zero_order_sound",
    "zero_stage_need",
]

MiB = 1 << 20


@dataclass(frozen=True)
class Estimate:
    states: StateBytes
    activations: int  # the peak phase's bytes above the model states (activations, temporaries, phase buffers)
    raw: int  # states + activations, uncalibrated: the peak phase's total (breakdown.peak)
    calibrated: int  # after the fit against measured probes (== raw with no measurement)
    calibration: tuple[float, float, float]
    breakdown: Breakdown | None = None  # the phases and parts behind raw

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
        return accumulates(self.global_batch, knobs.micro_batch_size, self.world_size)

    def _resident(self, knobs: Knobs) -> bool:
        """Whether the backward's activation term is the trace's peak with the grads resident rather than the fresh
        step's, where the grads not yet built offset the activations' peak (both above the full grads).

        Plain torch, ZeRO-0/1: when the step accumulates (the earlier micro-steps' grads are there while the later
        ones peak). ZeRO-2/3 always: they hold no full grads (each grad is reduced into fixed partition / bucket
        buffers as the backward makes it: stage_1_and_2.py ``reduce_independent_p_g_buckets_and_remove_grads``,
        stage3.py ``__add_grad_to_ipg_bucket``), so nothing offsets the activations' peak; above the full grads,
        the grads-resident peak is exactly that peak with the grads in flight."""
        if knobs.engine == "deepspeed" and knobs.zero_stage in (2, 3):
            return True
        return self.accumulates(knobs)

    def _backward_note(self, knobs: Knobs) -> str:
        if knobs.engine == "deepspeed" and knobs.zero_stage in (2, 3):
            return " (the activations' peak with the grads in flight: ZeRO-2/3 hold no full grads)"
        return " (earlier micro-steps' grads resident)" if self._resident(knobs) else ""

    def backward_activations(self, knobs: Knobs) -> int:
        """Activations + temporaries of the forward+backward (with the earlier micro-steps' grads resident when
        :meth:`_resident`; traces older than that field fall back to the plain peak)."""
        return self._backward(knobs, from_first_grad=False)

    def backward_from_first_grad(self, knobs: Knobs) -> int:
        """The same, counted from the backward's first parameter grad on (where ZeRO-1/2 allocate their reduce
        buckets); traces older than the field read the whole micro-step's."""
        return self._backward(knobs, from_first_grad=True)

    def _backward(self, knobs: Knobs, from_first_grad: bool) -> int:
        resident = self._resident(knobs)

        def need(p: TracePoint) -> int:
            whole = p.activation_bytes
            after = p.after_grad_activation_bytes
            if resident and p.resident_activation_bytes is not None:
                whole, after = p.resident_activation_bytes, p.resident_after_grad_activation_bytes
            return (after if from_first_grad and after is not None else whole) - _copies(p)

        return (traced(self.trace, knobs, need) or 0) + self.autocast_copies(knobs)

    def autocast_copies(self, knobs: Knobs) -> int:
        """The weights' low-precision copies torch.autocast keeps through a mixed-precision forward (the traced
        ``autocast_cache_bytes``): held by the plain torch engine (fp32 weights under autocast, as the Trainer runs
        without DeepSpeed); a DeepSpeed bf16/fp16 engine casts the module itself and holds none. Independent of batch
        and length, so it is taken out of every phase's bytes before they are scaled and added back here."""
        if knobs.engine != "torch" or knobs.precision not in ("bf16", "fp16"):
            return 0
        points = [p for p in self.trace.points if p.precision == knobs.precision and same_mode(p, False)]
        return max((_copies(p) for p in points), default=0)

    def step_temporaries(self, knobs: Knobs) -> int:
        """The optimizer step's temporaries: the traced AdamW's for plain torch, ZeRO-0 and ZeRO-3; none beyond the
        grad partition for ZeRO-1/2, whose step runs on the partition (measured on the recorded tables). ZeRO-3 in
        bf16 / fp16 adds one more flat fp32 copy of the rank's grad partition: its step unscales it out of place
        (``div.Tensor`` of the flat partition, seen at the failed allocation of a ZeRO-3 bf16 probe; t5-wide-1rank-bf16
        was 12.6% low without it where the step is the peak)."""
        if knobs.engine == "deepspeed" and knobs.zero_stage in (1, 2):
            return 0
        step = traced(self.trace, knobs, lambda p: p.step_temp_bytes) or 0
        if knobs.engine == "deepspeed" and knobs.zero_stage == 3 and knobs.precision in ("bf16", "fp16"):
            step += self._zero(knobs).grad_partition
        return step

    def activation_bytes(self, knobs: Knobs) -> int:
        """The larger of the two phases' activations + temporaries (what the calibration scales)."""
        return max(self.backward_activations(knobs), self.step_temporaries(knobs))

    def states(self, knobs: Knobs) -> StateBytes:
        tr = self.trace
        if knobs.engine == "fsdp2":
            return fsdp_states(self._fsdp(knobs), knobs)
        return model_state_bytes(
            knobs, tr.param_count, self.world_size, tr.largest_param, tr.trainable_count, tr.optimizer_state()
        )

    def breakdown(self, knobs: Mapping[str, Any] | Knobs) -> Breakdown:
        """Each phase's peak on a rank, part by part (uncalibrated); data-parallel ranks alike. The eval phases
        appear when the config evaluates and the trace has them (traced with the job's Evaluation)."""
        k = knobs if isinstance(knobs, Knobs) else Knobs.model_validate(dict(knobs))
        if k.engine == "fsdp2":
            phases = tuple(fsdp_phases(self._fsdp(k), k, self.trace.padding_free is not None))
        else:
            phases = (*self._train_phases(k), *self._eval_phases(k))
        said = NOT_COVERED + (NOT_COVERED_COMPILED if self.trace.compiled else "")
        return Breakdown(ranks=(RankEstimate(rank=None, phases=phases),), not_covered=said)

    def _fsdp(self, k: Knobs) -> list[FsdpPoint]:
        """An FSDP2 config's traced points (tuner.memory.fsdp: its own probe traced, not the plain trace's
        arithmetic); a ConfigError when the trace has none of its kind."""
        return fsdp_matching(self.trace, k, shard_world(k, self.world_size), self.accumulates(k))

    def _zero(self, k: Knobs) -> PhaseBuffers:
        tr = self.trace
        return zero_buffers(
            k, tr.param_count, self.world_size, tr.largest_param, tr.trainable_count, accumulates=self.accumulates(k)
        )

    def _train_phases(self, k: Knobs) -> list[PhaseEstimate]:
        st = self.states(k)
        buffers = self._zero(k)
        host = "host memory (offload_optimizer)" if k.offload_optimizer and k.engine == "deepspeed" else ""
        resident = self._backward_note(k)
        grads = Part(GRADIENTS, st.grads)
        backward_grads = grads
        if not buffers.partition_grads_in_backward:
            where = "host (offload_optimizer)" if k.offload_optimizer else "built at the backward's first reduce"
            backward_grads = Part(GRADIENTS, 0, f"ZeRO-2's grad partition: {where}")
        fb_zero, fb_act, fb_note = self._backward_peak(k, buffers)
        phases = []
        for phase, zero, act, note, grad_part in (
            (
                FORWARD_BACKWARD,
                fb_zero,
                fb_act,
                "fake-tensor trace" + resident + fb_note + pairs_note(self.trace),
                backward_grads,
            ),
            (
                OPTIMIZER_STEP,
                buffers.optimizer_step,
                self.step_temporaries(k),
                "the optimizer step's temporaries",
                grads,
            ),
        ):
            if k.engine == "torch" or k.zero_stage in (0, 3):  # ZeRO-3's step: + the fp32 grad partition it builds
                # and hpZ's secondary partition (ZeRO++), which an accumulating forward+backward carries too
                step = buffers.grad_partition + buffers.secondary
                carried = buffers.secondary if buffers.secondary_in_backward else 0
                zero = st.buffers + (step if phase == OPTIMIZER_STEP else carried)
            parts = (
                Part(PARAMETERS, st.params, "host memory (offload_param)" if k.offload_param else ""),
                *reference_parts(self.trace, k, self.world_size),
                grad_part,
                Part(OPTIMIZER, st.optimizer, host),
                Part(ZERO_BUFFERS, zero),
                Part(ACTIVATIONS, act, note, named(self.trace, k, phase) if act else ()),
            )
            phases.append(PhaseEstimate(phase, parts))
        return phases

    def _backward_peak(self, k: Knobs, buffers: PhaseBuffers) -> tuple[int, int, str]:
        """The forward+backward's (ZeRO buffers, activations, note) at its peak. ZeRO-1/2 allocate their reduce
        bucket(s) at the backward's first parameter grad (DeepSpeed 0.19 stage_1_and_2.py: ``setup_buckets`` from
        ``process_gradients``) and free them in the epilogue (``_release_ipg_buffers``), which ZeRO-2 runs after
        every backward and ZeRO-1 only at the accumulation boundary (engine.py ``allreduce_gradients``). So where
        the buckets are new in this backward (ZeRO-2; ZeRO-1 without accumulation) the peak is the larger of the
        whole micro-step's activations without them and those from the first grad on with them. A causal LM's loss
        (log-softmax over the vocabulary and its backward) peaks before any grad: on a tiny Llama at micro 4,
        length 256, the buckets' 7.6 MiB were counted on top of it (ZeRO-2 read 35% high)."""
        whole = self.backward_activations(k)
        fresh_buckets = k.zero_stage == 2 or (k.zero_stage == 1 and not self.accumulates(k))
        if k.engine != "deepspeed" or not fresh_buckets or not buffers.reduce:
            return buffers.forward_backward, whole, ""
        after = self.backward_from_first_grad(k)
        before_buckets = buffers.forward_backward - buffers.reduce
        if whole + before_buckets > after + buffers.forward_backward:
            return before_buckets, whole, "; the reduce bucket comes at the first grad, after this peak"
        return buffers.forward_backward, after, ""

    def _eval_phases(self, k: Knobs) -> list[PhaseEstimate]:
        """The eval forward and (``generate``) the decode: params, optimizer states and the ZeRO buffers that
        persist, no grads (the Trainer evaluates after the step's zero_grad), the eval batch's activations."""
        if k.eval_batch_size is None and not k.generate:
            return []
        size = k.eval_batch_size or k.micro_batch_size
        tr, st, buffers = self.trace, self.states(k), self._zero(k)
        ek = self._eval_knobs(k)

        def at(value: Callable[[TracePoint], int | None]) -> int | None:
            return traced(tr, ek, value, batch=lambda p: p.eval_batch_size or 1, wanted=size)

        def less_copies(value: Callable[[TracePoint], int | None]) -> Callable[[TracePoint], int | None]:
            return lambda p: None if (v := value(p)) is None else v - _copies(p)

        copies = self.autocast_copies(k)

        # ZeRO-1/2 free their reduce buckets in the backward's epilogue (``_release_ipg_buffers``: ZeRO-2 after every
        # backward, ZeRO-1 at the accumulation boundary), so an eval after the step holds only the offload staging;
        # ZeRO-3 keeps its bucket and gathered layer (measured: a tiny Llama's eval forward under ZeRO-2 with
        # DeepSpeed's default 5e8-element bucket peaked at 6.2 MiB, the estimate read 1.9 GB with the bucket)
        persistent = st.buffers if k.engine == "torch" or k.zero_stage in (0, 3) else buffers.offload_staging
        host = "host memory (offload_optimizer)" if k.offload_optimizer and k.engine == "deepspeed" else ""
        states = (
            Part(PARAMETERS, st.params, "host memory (offload_param)" if k.offload_param else ""),
            *reference_parts(tr, k, self.world_size),
            self._eval_grads(k, st),
            Part(OPTIMIZER, st.optimizer, host),
            Part(ZERO_BUFFERS, persistent),
        )
        phases = []
        note = f"eval batch {size}" + (f", with autocast's weight copies ({copies / 2**20:,.1f} MiB)" if copies else "")
        forward = at(less_copies(lambda p: p.eval_bytes))
        if forward is not None:
            act = Part(ACTIVATIONS, forward + copies, note, named(tr, ek, EVAL_FORWARD, size))
            phases.append(PhaseEstimate(EVAL_FORWARD, (*states, act)))
        decode, cache = at(less_copies(lambda p: p.generate_bytes)), at(lambda p: p.generate_cache_bytes)
        if k.generate and decode is not None:
            c = cache or 0
            act = Part(ACTIVATIONS, max(0, decode - c) + copies, note, named(tr, ek, GENERATE, size))
            phases.append(PhaseEstimate(GENERATE, (*states, act, Part(GENERATION_CACHE, c, "KV cache, full length"))))
        return phases

    def _eval_knobs(self, k: Knobs) -> Knobs:
        """The config whose traced points hold ``k``'s eval phases: its own, or for a checkpointed config whose
        points were traced without them (tuner.memory.trace.trace ``evaluate_checkpointed``), the same config
        without checkpointing (evaluation runs in eval mode, checkpointing off: the same bytes)."""
        if not k.gradient_checkpointing:
            return k
        size = k.eval_batch_size or k.micro_batch_size
        if traced(self.trace, k, lambda p: p.eval_bytes, batch=lambda p: p.eval_batch_size or 1, wanted=size) is None:
            return k.model_copy(update={"gradient_checkpointing": False})
        return k

    @staticmethod
    def _eval_grads(k: Knobs, st: StateBytes) -> Part:
        """The grads an eval after the step holds: none (the step's zero_grad freed them), but ZeRO-3's flat grad
        partition buffer, allocated once on the device in the optimizer's __init__ and never freed (DeepSpeed 0.19
        stage3.py ``grad_partitions_flat_buffer``; on the host with offload_optimizer)."""
        if k.engine == "deepspeed" and k.zero_stage == 3 and not k.offload_optimizer:
            return Part(GRADIENTS, st.grads, "ZeRO-3's flat grad partition buffer, kept from the optimizer's start")
        return Part(GRADIENTS, 0, "freed by the step's zero_grad")

    def predict(self, knobs: Mapping[str, Any] | Knobs) -> Estimate:
        k = knobs if isinstance(knobs, Knobs) else Knobs.model_validate(dict(knobs))
        parts = self.breakdown(k)
        states = self.states(k)
        raw = parts.peak
        act = raw - states.total  # what the calibration's activation term scales: the peak above the states
        a, b, c = self._theta
        calibrated = int(a * states.total + b * act + c)
        return Estimate(
            states=states, activations=act, raw=raw, calibrated=calibrated, calibration=self._theta, breakdown=parts
        )

    def observe(self, knobs: Mapping[str, Any] | Knobs, measured_peak: int) -> None:
        """Adds a measured peak (bytes, the max over ranks) and refits the calibration; a config the trace cannot
        estimate (no traced point of its kind) is a ConfigError, and nothing is added."""
        k = knobs if isinstance(knobs, Knobs) else Knobs.model_validate(dict(knobs))
        self.breakdown(k)
        self.observations.append((k.model_dump(), int(measured_peak)))
        self._refit()

    def _refit(self) -> None:
        # relative errors (small and large configs count alike); the intercept in units of the median measured peak
        unit = float(sorted(m for _, m in self.observations)[len(self.observations) // 2] or 1)
        rows: list[tuple[list[float], float]] = []
        for kd, measured in self.observations:
            k = Knobs.model_validate(kd)
            states = self.states(k).total
            act = self.breakdown(k).peak - states
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
        t = solve3(ata, aty)
        self._theta = (max(t[0], 0.0), max(t[1], 0.0), t[2] * unit)

    def errors(self) -> list[float]:
        """Relative errors (predicted / measured - 1) of the current calibration on the observed probes."""
        out = []
        for kd, measured in self.observations:
            out.append(self.predict(kd).calibrated / max(measured, 1) - 1.0)
        return out


def accumulates(global_batch: int | None, micro_batch_size: int, world_size: int) -> bool:
    """Whether a step at this micro batch runs several micro-steps; an unknown global batch: assumed so."""
    if global_batch is None:
        return True
    return (accumulation_steps(global_batch, micro_batch_size, world_size) or 2) > 1


def _copies(p: TracePoint) -> int:
    """A traced point's autocast weight copies (0 for fp32 points and traces older than the field)."""
    return p.autocast_cache_bytes or 0
