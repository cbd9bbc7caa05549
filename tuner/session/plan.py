"""The dry run of a search (`tuner search --dry-run`): the job, the space, what the memory estimate rules out, and
the expected probe count and time, before any device is used. Writes nothing, probes nothing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trials.contract import FSDP_KNOBS, ZERO_PP_KNOBS, Knobs
from tuner.job.space import ZERO_KNOBS
from tuner.search.request import SearchRequest

MiB = 1 << 20


@dataclass(frozen=True)
class Plan:
    """What a search would do, before any device is used (`tuner search --dry-run`)."""

    job: str | None  # the job held fixed (Job.describe)
    configs: int  # configs in the space that reach the global batch
    ruled_out: int | None  # of those, what the memory estimate puts far over the device memory (None: no estimate)
    estimate_note: str | None  # how the trace went, or why there is none
    expected_probes: int  # about: the configs left, at most --n-trials, at most what the budget holds
    expected_s: float  # about: expected_probes x the first probe's expected seconds, at most the budget
    crash: str | None = None  # with --dataset and a baseline: when their config would crash on their data
    searched: tuple[str, ...] = ()  # "knob: choices" per knob with more than one choice
    baseline: tuple[str, ...] = ()  # the baseline's predicted peak per phase against the device memory
    rule: str | None = None  # what "ruled out" means for this search

    def lines(self, request: SearchRequest) -> list[str]:
        ruled = "no memory estimate" if self.ruled_out is None else f"{self.ruled_out} ruled out by the memory estimate"
        out = [
            f"study {request.study_name}: {request.model.source}, world size {request.world_size}"
            f"{node_layout_text(request)}, global batch {request.global_batch}, budget {request.budget_s:.0f} s"
            f"{node_hours_text(request.budget_s, request.nnodes)}",
            f"your job (held fixed): {self.job}" if self.job else "your job: (no job settings stored)",
            *([f"  {request.sources}"] if request.sources else []),
            *request.data_lines(),
            f"space: {self.configs} configs; {ruled}",
            *(f"  searched: {line}" for line in self.searched),
        ]
        if self.rule:
            out.append(self.rule)
        if self.crash:
            out.append(self.crash)
        if self.estimate_note:
            out.append(self.estimate_note)
        out += list(self.baseline)
        out.append(
            f"expected: at most about {self.expected_probes} probes in {self.expected_s / 60:.0f} min"
            f"{node_hours_text(self.expected_s, request.nnodes)} (before any probe is measured, one is guessed at "
            f"{request.schedule.first_probe_s:.0f} s; inferred configs cost nothing)"
        )
        if request.nnodes > 1:
            out.append(
                f"across nodes: one `tuner search` per node, the same command (or srun -N {request.nnodes} "
                "--ntasks-per-node 1 tuner search ...), every node busy for the whole search; NCCL's buffers are not "
                "in the estimate (they grow with the communicators: hpZ's and HSDP's groups add some), the probes "
                "measure them"
            )
        out.append("nothing was written and no device was used; run without --dry-run to search")
        return out


def node_layout_text(request: SearchRequest) -> str:
    """`` (2 nodes x 4 ranks)`` for a search across nodes, else nothing."""
    return f" ({request.nnodes} nodes x {request.world_size // request.nnodes} ranks)" if request.nnodes > 1 else ""


def node_hours_text(seconds: float, nnodes: int) -> str:
    """What ``seconds`` of a search across ``nnodes`` nodes cost in node-hours (every node is held throughout)."""
    return f" = {seconds * nnodes / 3600:.2f} node-hours on {nnodes} nodes" if nnodes > 1 else ""


def plan(request: SearchRequest, estimate: bool | None) -> Plan:
    """The dry run of ``request``: the space, what the memory estimate rules out (a trace, on CPU), the expected
    probe count and time. Writes nothing, probes nothing."""
    from tuner.session.memory import traced

    configs = list(request.space.configs())
    ruled_out = None
    model = traced(request, estimate)
    estimator, note = model.estimator, model.note
    capacity = request.device_memory
    if estimator is not None and capacity:
        margin = request.schedule.estimate_margin
        ruled_out = sum(1 for k in configs if _predicted(estimator, k) > margin * capacity)
    elif estimator is not None:
        note = f"{note}; without --device-memory the estimate rules nothing out before the first probe"
    left = len(configs) - (ruled_out or 0)
    per_probe = request.schedule.first_probe_s
    probes = min(left, request.n_trials or left, max(1, int(request.budget_s // per_probe)))
    rule = None
    if ruled_out is not None and capacity:
        margin = request.schedule.estimate_margin
        rule = (
            f"ruled out = predicted peak above {margin:g} x the device memory ({margin * capacity / MiB:,.0f} MiB): "
            "so far over that a probe would only confirm the OOM; configs nearer the edge are probed"
        )
    return Plan(
        job=request.job.describe() if request.job is not None else None,
        configs=len(configs),
        ruled_out=ruled_out,
        estimate_note=note,
        expected_probes=probes,
        expected_s=min(request.budget_s, probes * per_probe),
        crash=baseline_crash(request, estimator),
        searched=searched(request),
        baseline=baseline_phases(estimator, request.baseline, capacity),
        rule=rule,
    )


def baseline_crash(request: SearchRequest, estimator: Any) -> str | None:
    """With the user's data and config: the share of its batches their config cannot hold and when a shuffled run
    meets the first (tuner.memory.crash), from the estimate at each batch's padded input length."""
    if request.data is None or request.baseline is None or estimator is None or not request.device_memory:
        return None
    from tuner.session.crash_line import crash_line

    assert request.job is not None
    return crash_line(
        request.data, request.job, request.baseline, request.world_size, request.device_memory, estimator, "your config"
    )


def searched(request: SearchRequest) -> tuple[str, ...]:
    """The knobs the search varies, each with its choices (the others are fixed: the job's, or the space's one)."""
    space = request.space.model_dump(mode="json")
    return tuple(
        f"{name}: {', '.join('default' if v is None else str(v) for v in values)}"
        for name, values in space.items()
        if isinstance(values, list) and len(values) > 1 and _sampled(name, request.space.engine)
    )


def _sampled(name: str, engines: Sequence[str]) -> bool:
    """Whether the space samples knob ``name`` for any of its engines (ZeRO knobs: DeepSpeed; FSDP ones: FSDP2)."""
    if name == "zero_stage" or name in ZERO_KNOBS or name in ZERO_PP_KNOBS:
        return "deepspeed" in engines
    return name not in (*FSDP_KNOBS, "dp_replicate_size") or "fsdp2" in engines


def baseline_phases(estimator: Any, baseline: Knobs | None, capacity: int | None) -> tuple[str, ...]:
    """The baseline's predicted peak per phase (the one shared estimate, uncalibrated) against the device memory."""
    from tuner.errors import TunerError

    if estimator is None or baseline is None:
        return ()
    try:
        rank = estimator.breakdown(baseline).worst
    except TunerError as err:
        return (f"your baseline: no estimate ({err})",)
    against = f" of {capacity / MiB:,.0f} MiB device memory" if capacity else ""
    out = [f"your baseline, predicted peak per rank{against} (uncalibrated):"]
    for phase in rank.phases:
        over = " OVER" if capacity and phase.total > capacity else ""
        out.append(f"  {phase.title}: {phase.total / MiB:,.1f} MiB{over}")
    out.append(f"  {estimator.breakdown(baseline).not_covered}")
    return tuple(out)


def _predicted(estimator: Any, knobs: Knobs) -> int:
    from tuner.errors import TunerError

    try:
        return int(estimator.predict(knobs).calibrated)
    except TunerError:  # no traced point for this checkpointing/precision: not ruled out
        return 0
