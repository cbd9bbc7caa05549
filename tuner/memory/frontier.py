"""The feasibility frontier: what measured OOMs and stable probes imply about configs not yet probed.

Memory need is monotone in most knobs. If a config OOMs, every config that needs *at least as much* memory on every
knob OOMs too; if a config is stable, every config needing *no more* on every knob is stable too. The order per knob:

====================== ===================================================================================
knob                   "needs at least as much" when ...
====================== ===================================================================================
micro_batch_size       larger or equal
max_length             longer or equal
zero_stage             equal by default; ordered by ``Frontier(stage_need={stage: rank})`` (see below)
offload_optimizer      off, or equal (offload moves optimizer state to host memory)
gradient_checkpointing off, or equal (checkpointing drops activations)
allgather/reduce       larger or equal; compared only when *both* configs run ZeRO >= 1 (stage 0 has no buckets).
bucket sizes           ``None`` means DeepSpeed's default, 5e8 elements.
eval_batch_size        larger or equal; ``None`` (no eval pass) needs the least
generate               on, or equal (generation runs on top of the eval forward)
reshard_after_forward  off, or equal (FSDP2 keeps each block's gathered parameters to its backward)
offload_params         off, or equal (FSDP2 keeps the sharded parameters, gradients and optimizer on the host)
offload_param          off, or equal (ZeRO-3 keeps its parameter partitions on the host)
everything else        equal: engine, overlap_comm, contiguous_gradients, precision, alloc_conf
====================== ===================================================================================

Decisions:

- ``engine="torch"`` is *not* ordered against DeepSpeed stage 0: plain torch keeps no DeepSpeed buffers, DeepSpeed
  stage 0 keeps no extra optimizer copy either, and neither bound holds in general. The two engines are compared only
  with themselves. One extra probe is cheap; a wrong inference can hide the best config forever.
- ZeRO stage is NOT ordered by default. Measured on this project's emulated device (tiny T5, 1 rank, buckets of 2e6
  elements): micro 4 x len 128 peaks at 40.6 MiB with stage 0 but 50.2 MiB with stage 1 and 47.6 MiB with stage 2 —
  one rank partitions nothing, while ZeRO adds an fp32 partition copy and a full contiguous reduce bucket. Higher
  stages save memory only when the partitioned model states (~12-16 bytes/param x (1 - 1/N)) outweigh those buffers:
  many ranks, a big model; with one or two ranks and a small model the order is reversed. So the order of stages is
  an input: ``stage_need={0: 0, 2: 1, 1: 2}`` says stage 1 needs the most, then 2, then 0 (what
  ``tuner.memory.estimator.zero_stage_need`` derives from the model-state arithmetic for a space, or None when no order
  holds across it); ``zero_order=True`` is the textbook order 0 >= 1 >= 2 >= 3. The self-correction below guards both.
- overlap_comm and contiguous_gradients change which buffers DeepSpeed allocates, not monotonically: equal only.
- The frontier is valid for one (model, world size, device memory, headroom) context; keep one per study context.
- Self-correction: the orders above are the documented DeepSpeed behaviour, but a rule can fail on a real setup (e.g.
  ZeRO-1 on one rank partitions nothing yet keeps an fp32 partition copy, so it may need *more* than stage 0). When two
  measured configs contradict the rules, every ordered knob on which they differ is demoted to "equal" for the rest of
  the study, the contradiction is kept in :attr:`Frontier.conflicts`, and configs with evidence both ways get no answer.

Pure: no torch import. Knob dicts use the field names of :class:`trials.contract.Knobs`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from trials.contract import BUCKET_KNOBS, DS_DEFAULT_BUCKET, Knobs

Verdict = Literal["oom", "fits"]
Direction = Literal["up", "down", "equal", "rank"]


#: "up": a larger value needs at least as much memory; "down": a smaller value does; "equal": not ordered.
DEFAULT_ORDER: dict[str, Direction] = {
    "micro_batch_size": "up",
    "max_length": "up",
    "zero_stage": "equal",
    "offload_optimizer": "down",
    "gradient_checkpointing": "down",
    "allgather_bucket_size": "up",
    "reduce_bucket_size": "up",
    "eval_batch_size": "up",
    "generate": "up",
    "reshard_after_forward": "down",  # FSDP2: keeping the gathered blocks to the backward needs more
    "offload_params": "down",
    "offload_param": "down",  # ZeRO-3's parameter offload (a dump leaves it out when off)
    "engine": "equal",
    "overlap_comm": "equal",
    "contiguous_gradients": "equal",
    "precision": "equal",
    "alloc_conf": "equal",
}


# The probe statuses that measure device memory: "ok" (fits when stable, else over the headroom) and "oom". A host OOM,
# a busy GPU or an outside kill says nothing about whether a config fits the device: never a frontier observation
# (a host OOM of an offloading config must not rule out the configs that offload nothing).
DEVICE_VERDICT_STATUSES = frozenset({"ok", "oom"})


def device_fits(status: str, stable: bool) -> bool | None:
    """What a measured probe tells the frontier: True (fits: stable), False (an OOM, or a peak over the headroom), or
    None (nothing about device memory: a timeout, an error, host-oom, device-busy, killed)."""
    if str(status) not in DEVICE_VERDICT_STATUSES:
        return None
    return str(status) == "ok" and stable


def normalize(knobs: Mapping[str, Any] | Knobs) -> dict[str, Any]:
    """Full knob dict with defaults filled in (validated by :class:`Knobs`)."""
    if isinstance(knobs, Knobs):
        return knobs.model_dump()
    return Knobs.model_validate(dict(knobs)).model_dump()


def _value(knobs: Mapping[str, Any], name: str) -> Any:
    v = knobs.get(name)
    if name in BUCKET_KNOBS and v is None:
        return DS_DEFAULT_BUCKET
    if name in ("eval_batch_size", "offload_param") and v is None:
        return 0
    if isinstance(v, bool):
        return int(v)
    return v


def needs_at_least(
    a: Mapping[str, Any],
    b: Mapping[str, Any],
    order: Mapping[str, Direction] | None = None,
    stage_need: Mapping[int, int] | None = None,
) -> bool:
    """True when config ``a`` needs at least as much memory as config ``b`` on every knob.

    ``a`` and ``b`` are full knob dicts (see :func:`normalize`). Reflexive and transitive (a preorder). A knob with
    direction "rank" (only zero_stage) is ordered by ``stage_need``: stage -> rank, a strictly higher rank needs at
    least as much; distinct stages of equal rank, or missing from it, are not comparable.
    """
    order = DEFAULT_ORDER if order is None else order
    both_zero = int(a.get("zero_stage") or 0) >= 1 and int(b.get("zero_stage") or 0) >= 1
    for name, direction in order.items():
        if name in BUCKET_KNOBS and not both_zero:
            continue
        va, vb = _value(a, name), _value(b, name)
        if direction == "rank":
            ra, rb = (stage_need or {}).get(va), (stage_need or {}).get(vb)
            if va != vb and (ra is None or rb is None or ra <= rb):
                return False
            continue
        if direction == "equal" or va is None or vb is None:
            if va != vb:
                return False
        elif direction == "up":
            if va < vb:
                return False
        elif va > vb:  # "down"
            return False
    return True


@dataclass(frozen=True)
class Observation:
    knobs: dict[str, Any]
    fits: bool


@dataclass(frozen=True)
class Conflict:
    """Two measured configs whose outcomes contradict the order rules; ``demoted`` knobs became "equal"."""

    oom: dict[str, Any]
    fits: dict[str, Any]
    demoted: tuple[str, ...]


@dataclass
class Frontier:
    """Measured OOM/stable configs and what they imply. ``add`` what you measure, ``infer`` before you probe.

    ``zero_order=True`` also orders ZeRO stages (a lower stage needs at least as much): sound only where partitioning
    saves more than ZeRO's buffers cost (several ranks, a model much larger than the buckets).
    """

    zero_order: bool = False
    stage_need: dict[int, int] | None = None  # ZeRO stage -> memory rank (tuner.memory.estimator.zero_stage_need)
    order: dict[str, Direction] = field(default_factory=lambda: dict(DEFAULT_ORDER))
    observations: list[Observation] = field(default_factory=list)
    conflicts: list[Conflict] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.zero_order and self.stage_need is None:
            self.stage_need = {0: 3, 1: 2, 2: 1, 3: 0}  # a lower stage needs at least as much
        if self.stage_need is not None:
            self.order["zero_stage"] = "rank"

    def add(self, knobs: Mapping[str, Any] | Knobs, fits: bool) -> None:
        """Record a measured outcome: ``fits=False`` for an OOM, ``fits=True`` for a stable probe.

        Timeouts and errors say nothing about memory: do not add them.
        """
        obs = Observation(normalize(knobs), bool(fits))
        for other in self.observations:
            if other.fits == obs.fits:
                continue
            oom, ok = (other, obs) if obs.fits else (obs, other)
            if needs_at_least(ok.knobs, oom.knobs, self.order, self.stage_need):
                self._demote(oom.knobs, ok.knobs)
        self.observations.append(obs)

    def _demote(self, oom: dict[str, Any], ok: dict[str, Any]) -> None:
        differing = tuple(
            name for name, d in self.order.items() if d != "equal" and _value(oom, name) != _value(ok, name)
        )
        for name in differing:
            self.order[name] = "equal"
        self.conflicts.append(Conflict(oom=oom, fits=ok, demoted=differing))

    def evidence(self, knobs: Mapping[str, Any] | Knobs) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(measured OOMs that imply ``knobs`` OOMs, measured stable configs that imply ``knobs`` fits)."""
        k = normalize(knobs)
        ooms = [
            o.knobs for o in self.observations if not o.fits and needs_at_least(k, o.knobs, self.order, self.stage_need)
        ]
        fits = [
            o.knobs for o in self.observations if o.fits and needs_at_least(o.knobs, k, self.order, self.stage_need)
        ]
        return ooms, fits

    def infer(self, knobs: Mapping[str, Any] | Knobs) -> Verdict | None:
        """ "oom" when a measured OOM needs no more than ``knobs``, "fits" when a stable config needs no less,
        None when nothing is implied (or the evidence contradicts itself)."""
        ooms, fits = self.evidence(knobs)
        if ooms and not fits:
            return "oom"
        if fits and not ooms:
            return "fits"
        return None

    def explain(self, knobs: Mapping[str, Any] | Knobs) -> str | None:
        """One line naming the measured config behind the inference, for trial records (cause "inferred-oom")."""
        ooms, fits = self.evidence(knobs)
        verdict = self.infer(knobs)
        if verdict is None:
            return None
        src = ooms[0] if verdict == "oom" else fits[0]
        return f"inferred-{verdict} from measured {describe(src)}"

    def __len__(self) -> int:
        return len(self.observations)


def describe(knobs: Mapping[str, Any]) -> str:
    """A short human label of the knobs that differ from the defaults."""
    defaults = Knobs(micro_batch_size=1, max_length=1, engine="fsdp2").model_dump() | {"engine": "deepspeed"}
    parts = [f"micro={knobs.get('micro_batch_size')}", f"len={knobs.get('max_length')}"]
    for name, value in knobs.items():
        if name in ("micro_batch_size", "max_length") or defaults.get(name) == value:
            continue
        parts.append(f"{name}={value}")
    return " ".join(parts)


def split(candidates: list[Mapping[str, Any]], frontier: Frontier) -> dict[str, list[Mapping[str, Any]]]:
    """Partitions candidates into {"oom": [...], "fits": [...], "unknown": [...]} by the frontier's inference."""
    out: dict[str, list[Mapping[str, Any]]] = {"oom": [], "fits": [], "unknown": []}
    for c in candidates:
        out[frontier.infer(c) or "unknown"].append(c)
    return out
