"""The estimate part by part: each phase of a training step, what its peak is made of, per rank.

Records only (pure): :mod:`tuner.memory.estimator` fills them from the trace and the model-state arithmetic, and
``tuner estimate`` (and what explains an OOM) reads them. A phase's peak is the sum of its parts; the step's peak is
the largest phase's. What no part covers (the CUDA context, NCCL's buffers, the caching allocator's reserve and
fragmentation) is named in :data:`NOT_COVERED`; a calibration against measured probes absorbs it.
"""

from __future__ import annotations

from dataclasses import dataclass

#: the phases of a training step the trace measures, in order
FORWARD_BACKWARD = "forward_backward"
OPTIMIZER_STEP = "optimizer_step"
EVAL_FORWARD = "eval_forward"
GENERATE = "generate"
PHASES = (FORWARD_BACKWARD, OPTIMIZER_STEP, EVAL_FORWARD, GENERATE)
PHASE_TITLES = {
    FORWARD_BACKWARD: "train forward + backward",
    OPTIMIZER_STEP: "optimizer step",
    EVAL_FORWARD: "eval forward",
    GENERATE: "generate",
}

#: the parts of a phase, in the order they print
PARAMETERS = "parameters"
REFERENCE = "reference model"  # a DPO job's frozen reference model (tuner.memory.reference)
GRADIENTS = "gradients"
OPTIMIZER = "optimizer states"
ZERO_BUFFERS = "ZeRO buffers"
GATHERED = "gathered parameters"  # FSDP2's all-gathered blocks (where DeepSpeed has its ZeRO buffers)
ACTIVATIONS = "activations + temporaries"
GENERATION_CACHE = "generation cache"
PARTS = (PARAMETERS, REFERENCE, GRADIENTS, OPTIMIZER, ZERO_BUFFERS, GATHERED, ACTIVATIONS, GENERATION_CACHE)


def columns(phases: tuple[PhaseEstimate, ...] | list[PhaseEstimate]) -> tuple[str, ...]:
    """The parts a table of these phases shows: FSDP2's gathered parameters in the ZeRO buffers' place when a phase
    has them (an FSDP2 config), else every part but them (as before FSDP2)."""
    fsdp = any(part.name == GATHERED for p in phases for part in p.parts)
    reference = any(part.name == REFERENCE for p in phases for part in p.parts)
    return tuple(n for n in PARTS if n != (ZERO_BUFFERS if fsdp else GATHERED) and (reference or n != REFERENCE))


NOT_COVERED = (
    "not covered: the CUDA context and cuBLAS workspace, NCCL buffers, the allocator's reserve and fragmentation "
    "(outside the trace; a calibration against measured probes absorbs them)"
)
#: added when the job compiles its model (torch_compile)
NOT_COVERED_COMPILED = (
    "; compiled graphs (torch_compile): the trace runs the eager kernels, a compiled step fuses and frees "
    "differently (the search calibrates on its compiled probes)"
)


@dataclass(frozen=True)
class Allocation:
    """One of the largest allocations of a phase, as the trace named it: the op, shape and dtype that asked for it.
    ``traced_at`` is the (micro batch, length) it was traced at when the shape was scaled to the config's."""

    op: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    traced_at: tuple[int, int] | None = None

    def describe(self) -> str:
        dims = " x ".join(f"{d:,}" for d in self.shape)
        scaled = f", scaled from micro {self.traced_at[0]} x length {self.traced_at[1]}" if self.traced_at else ""
        return f"{self.op} {self.dtype} {dims} ({self.nbytes / (1 << 20):,.1f} MiB{scaled})"


@dataclass(frozen=True)
class Part:
    """One part of a phase's peak, in bytes on one rank; ``note`` says where it lives or comes from; ``largest``
    names the part's largest allocations (activations: the trace's three largest, by op and shape)."""

    name: str
    nbytes: int
    note: str = ""
    largest: tuple[Allocation, ...] = ()


@dataclass(frozen=True)
class PhaseEstimate:
    """One phase's predicted peak on one rank, part by part."""

    phase: str
    parts: tuple[Part, ...]

    @property
    def total(self) -> int:
        return sum(p.nbytes for p in self.parts)

    def part(self, name: str) -> int:
        return sum(p.nbytes for p in self.parts if p.name == name)

    @property
    def title(self) -> str:
        return PHASE_TITLES.get(self.phase, self.phase)


@dataclass(frozen=True)
class RankEstimate:
    """Every phase of one rank (``rank`` None: every rank alike, as data-parallel ZeRO ranks are)."""

    rank: int | None
    phases: tuple[PhaseEstimate, ...]

    @property
    def peak(self) -> PhaseEstimate:
        """The phase with the largest peak (the first of equals, in :data:`PHASES` order)."""
        return max(self.phases, key=lambda p: p.total)

    def phase(self, name: str) -> PhaseEstimate:
        for p in self.phases:
            if p.phase == name:
                return p
        raise KeyError(name)

    def largest_part(self, name: str, phases: tuple[str, ...] = PHASES) -> PhaseEstimate | None:
        """The phase (of ``phases``, those this rank has) where part ``name`` is largest, the first of equals: its
        ``part(name)`` is the number `tuner estimate` prints in that phase's column. None: no such phase."""
        held = [p for p in self.phases if p.phase in phases]
        return max(held, key=lambda p: p.part(name)) if held else None


@dataclass(frozen=True)
class Breakdown:
    """The uncalibrated estimate of a config: phases x parts x rank, and what it does not cover."""

    ranks: tuple[RankEstimate, ...]
    not_covered: str = NOT_COVERED

    @property
    def peak(self) -> int:
        return max(r.peak.total for r in self.ranks)

    @property
    def worst(self) -> RankEstimate:
        return max(self.ranks, key=lambda r: r.peak.total)
