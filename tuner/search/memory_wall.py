"""Past the memory wall: after the opening, the incumbent's setting cannot take the next micro batch up. Which memory
the next micro batch lacks decides the move: when the model states (parameters, gradients, optimizer states: what does
not grow with the batch) fill most of the headroom, only the moves that free model states (a higher ZeRO stage, CPU
offload of the optimizer) can make room; when activations fill it, only checkpointing or a shorter length can.

Two measured peaks of the incumbent's setting at different micro batches split its memory: ``peak = fixed + micro x
per_sample`` (the two largest micro batches that finished, the ones nearest the wall). The proposer then tries the next
micro batch up in the settings that change only knobs of the binding kind, the cheapest in throughput first
(tuner.search.proposers.RELIEF's cost per move), skipping what the frontier rules out, until one fits; a setting
that turns offload on at a lower ZeRO stage counts as a model-state move when the prior says it frees memory on net
(offload is cheaper at a lower stage). The incumbent's setting is then climbed while its next micro batch up is
unsettled; a relief that fits without outranking the incumbent gets its next micro batch up once. Then the guide takes
over. Pure: it reads the evidence."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trials.contract import BUCKET_KNOBS, Knobs
from tuner.records import ProbeRow, ProbeStatus

MODEL_STATE_KNOBS = ("zero_stage", "offload_optimizer")
ACTIVATION_KNOBS = ("gradient_checkpointing", "max_length")
MODEL_STATES_DOMINATE = 0.5  # the fixed part above this fraction of the headroom line: model states fill memory


@dataclass(frozen=True)
class Split:
    """A setting's memory as ``fixed + micro x per_sample`` bytes, from two measured peaks."""

    fixed: float
    per_sample: float


def split(rows: Sequence[ProbeRow], setting: Callable[[Mapping[str, Any]], str], where: str) -> Split | None:
    """The memory split of the setting ``where`` from its finished probes (above the headroom or not): the two largest
    micro batches measured there. None with fewer than two."""
    peaks: dict[int, float] = {}
    for row in rows:
        if row.measured and row.status == ProbeStatus.OK and setting(row.knobs) == where and row.memory_need:
            micro = int(row.knobs["micro_batch_size"])
            peaks[micro] = max(peaks.get(micro, 0.0), float(row.memory_need))
    if len(peaks) < 2:
        return None
    (m_a, p_a), (m_b, p_b) = sorted(peaks.items())[-2:]
    per_sample = max((p_b - p_a) / (m_b - m_a), 0.0)
    return Split(fixed=max(p_a - m_a * per_sample, 0.0), per_sample=per_sample)


def binding_knobs(memory: Split, limit: float) -> tuple[str, ...]:
    """The knobs whose moves can make room: model-state knobs when the fixed part fills most of ``limit``."""
    return MODEL_STATE_KNOBS if memory.fixed >= MODEL_STATES_DOMINATE * limit else ACTIVATION_KNOBS


def relieving(here: Mapping[str, Any], there: Mapping[str, Any], knobs: Sequence[str]) -> bool:
    """Whether ``there`` differs from ``here`` only by memory-saving moves of ``knobs`` (a higher ZeRO stage, offload
    on, checkpointing on, a shorter length), at least one; bucket sizes and the micro batch are not compared."""
    moved = False
    for name in set(here) | set(there):
        if name in BUCKET_KNOBS or name == "micro_batch_size":
            continue
        a, b = here.get(name), there.get(name)
        if a == b:
            continue
        if name not in knobs:
            return False
        if name == "zero_stage" and not int(b or 0) > int(a or 0):
            return False
        if name == "max_length" and not int(b or 0) < int(a or 0):
            return False
        if name in ("offload_optimizer", "gradient_checkpointing") and not (b and not a):
            return False
        moved = True
    return moved


def trades_stage_for_offload(
    here: Mapping[str, Any],
    there: Mapping[str, Any],
    knobs: Sequence[str],
    relief: Mapping[str, tuple[float, float]],
    world_size: int,
) -> bool:
    """Whether ``there`` turns the optimizer's offload on at a lower ZeRO stage than ``here`` (and changes nothing
    else but buckets and the micro batch), freeing model-state memory on net by ``relief``'s prior (offload's freed
    against the stages' freed, scaled by 1 - 1/world_size): offload costs less at a lower stage."""
    if tuple(knobs) != MODEL_STATE_KNOBS or here.get("offload_optimizer") or not there.get("offload_optimizer"):
        return False
    if any(here.get(n) != there.get(n) for n in set(here) | set(there) if n not in (*BUCKET_KNOBS, *knobs)):
        return False
    down = int(here.get("zero_stage") or 0) - int(there.get("zero_stage") or 0)
    stage_freed = relief["zero_stage"][0] * (1 - 1 / world_size)
    return down > 0 and relief["offload_optimizer"][0] > down * stage_freed


def cost(here: Mapping[str, Any], there: Mapping[str, Any], relief: Mapping[str, tuple[float, float]]) -> float:
    """The prior throughput lost (log units, ``relief``'s second number) of the moves from ``here`` to ``there``."""
    lost = 0.0
    for name, (_, per_move) in relief.items():
        a, b = here.get(name), there.get(name)
        if a == b:
            continue
        lost += per_move * (int(b or 0) - int(a or 0) if name == "zero_stage" else 1)
    return lost


def next_past_wall(
    incumbent: Knobs,
    settings: Mapping[str, Sequence[Knobs]],
    rows: Sequence[ProbeRow],
    verdict: Callable[[Knobs], str | None],
    limit: float,
    relief: Mapping[str, tuple[float, float]],
    world_size: int,
) -> Knobs | bool | None:
    """The next config past the incumbent's memory wall: the next micro batch up in a relieving setting (smallest
    buckets; ``relieving`` or ``trades_stage_for_offload``), the cheapest first. ``verdict``: "fits" / "oom" from
    the measurements and the frontier. While the incumbent's next micro batch up is unsettled, that one (a climb: once
    a relief outranks the old incumbent, its setting is climbed until its own wall). When a relief fits but does not
    outrank the incumbent (one noisy probe), its setting's next micro batch up, once: the guide explores around the
    incumbent and would leave the setting that made room with a single point. Returns the knobs to probe, True when
    the wall is passed (and that step is settled), or None when there is nothing to do (no wall, no split, no move
    left)."""
    home = setting_of(incumbent.model_dump(mode="json"))
    above = [k for k in settings.get(home, []) if k.micro_batch_size > incumbent.micro_batch_size]
    if not above:
        return None  # nothing larger here
    ahead = verdict(above[0])
    if ahead is None:
        return above[0]  # climb: the setting that made room (or any unsettled one) is settled upwards
    # no wall when the next micro batch up fits (and does not outrank the incumbent)
    memory = split(rows, setting_of, home) if ahead == "oom" else None
    if memory is None:
        return None
    knobs = binding_knobs(memory, limit)
    options = relief_options(home, above[0].micro_batch_size, settings, knobs, relief, world_size)
    return _first_unsettled(options, settings, verdict)


def setting_of(knobs: Mapping[str, Any]) -> str:
    """A config's setting: every knob but the micro batch (tuner.search.proposers groups the grid by it)."""
    return json.dumps({**knobs, "micro_batch_size": None}, sort_keys=True)


def relief_options(
    home: str,
    micro: int,
    settings: Mapping[str, Sequence[Knobs]],
    knobs: Sequence[str],
    relief: Mapping[str, tuple[float, float]],
    world_size: int,
) -> list[Knobs]:
    """The configs at micro batch ``micro`` of the settings that relieve ``home`` by moves of ``knobs`` (smallest
    buckets; ``relieving`` or ``trades_stage_for_offload``), the cheapest in throughput first (``cost``)."""
    here = json.loads(home)
    options: list[tuple[float, Knobs]] = []
    for other, configs in settings.items():
        there = json.loads(other)
        moves = relieving(here, there, knobs) or trades_stage_for_offload(here, there, knobs, relief, world_size)
        if not moves or not _smallest_buckets(there, settings):
            continue
        at = [k for k in configs if k.micro_batch_size == micro]
        if at:
            options.append((cost(here, there, relief), at[0]))
    options.sort(key=lambda o: o[0])
    return [k for _, k in options]


def _first_unsettled(
    options: Sequence[Knobs], settings: Mapping[str, Sequence[Knobs]], verdict: Callable[[Knobs], str | None]
) -> Knobs | bool | None:
    """The first relief option without a verdict; True when one fits (passed) and its setting's next micro batch up
    is settled or absent, else that one; None when every option runs out of memory."""
    for option in options:
        found = verdict(option)
        if found == "fits":  # passed; the incumbent is still the best: the relief setting's next micro batch up
            there = settings[setting_of(option.model_dump(mode="json"))]
            higher = [k for k in there if k.micro_batch_size > option.micro_batch_size]
            return higher[0] if higher and verdict(higher[0]) is None else True
        if found is None:
            return option
    return None


def _smallest_buckets(there: Mapping[str, Any], settings: Mapping[str, Sequence[Knobs]]) -> bool:
    for bucket in BUCKET_KNOBS:
        values = [
            v
            for s in settings
            if (d := json.loads(s))["zero_stage"] == there["zero_stage"] and (v := d.get(bucket)) is not None
        ]
        if values and there.get(bucket) != min(values):
            return False
    return True
