"""A search across nodes on this worker: it joins the study as one of its nodes, then leads the search (its probes
posted across nodes: tuner.session.node_probe.NodeProbe) or follows the leader's (runs its part of each), taking the
lead when the leader stops beating, until the search ends."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol, TypeVar

from trials.contract import ProbeConfig, ProbeResult
from tuner.errors import NodeError
from tuner.records import baseline_row
from tuner.records.run import RunStatus
from tuner.search.request import SearchRequest
from tuner.search.selection import best_stable
from tuner.session.driver import SearchSummary
from tuner.session.node_probe import Followed, NodeProbe, follow
from tuner.session.nodes import Member, route_address
from tuner.session.recovery import worker_name
from tuner.settings import Settings, slurm_step
from tuner.storage import Store
from tuner.units import Deadline


class _Summarised(Protocol):
    @property
    def summary(self) -> SearchSummary: ...


class _Events(Protocol):
    def node(self, line: str) -> None: ...


R = TypeVar("R", bound=_Summarised)


def run_across_nodes(
    request: SearchRequest,
    store: Store,
    deadline: Deadline,
    settings: Settings,
    events: _Events,
    *,
    lead: Callable[[Callable[[ProbeConfig], ProbeResult]], R],
    followed: Callable[[SearchSummary], R],
    trials: Callable[[], int],
) -> R:
    """Runs this worker's share of ``request`` (``request.nnodes`` > 1) until the search ends: ``lead(probe)`` runs
    the search with the probe launcher across nodes when this worker leads; ``followed(summary)`` is what a follower
    hands back (its summary reads the study's stored rows; ``trials``: the study's trial count)."""
    from tuner.probing.schedule_check import ScheduleChecked

    slurm = slurm_step()
    address = settings.node_address or route_address(request.storage)
    nproc = request.world_size // request.nnodes
    member = Member(
        store,
        request.study_name,
        worker_name(),
        address,
        nnodes=request.nnodes,
        nproc=nproc,
        timeout_s=settings.node_timeout_s,
        nodelist=slurm.nodelist if slurm is not None else "",
    )
    say = events.node
    with member:
        while True:
            if member.lead():
                say(f"leading the search across {request.nnodes} nodes x {nproc} ranks; rendezvous on {address}")
                probe = NodeProbe(settings, member, say)
                try:
                    ran = lead(ScheduleChecked(probe, probe.env))
                except NodeError as err:
                    member.end(str(err))
                    raise
                member.end(ran.summary.stop_reason)
                member.message = f"led the search: {ran.summary.stop_reason}"
                return ran
            say(f"following the search across {request.nnodes} nodes as {member.worker} at {address}")
            done = _follow(settings, member, store, request, deadline, say)
            if done is not None:
                member.message = f"followed: {done[0].message}"
                return followed(follower_summary(store, request, done[1], done[0], done[2], trials()))


def _follow(
    settings: Settings,
    member: Member,
    store: Store,
    request: SearchRequest,
    deadline: Deadline,
    say: Callable[[str], None],
) -> tuple[Followed, int, float] | None:
    """Follows the leader as a search run of its own; (what it did, its run, its seconds), or None: it took the
    lead."""
    start = time.monotonic()
    run_id = store.start_run(request.study_name, member.worker, request.budget_s, None)
    member.run_id = run_id
    status, done = RunStatus.INTERRUPTED, None
    try:
        done = follow(settings, member, lambda: deadline.left, say)
        status = RunStatus.FINISHED
    finally:
        member.run_id = None
        store.finish_run(run_id, status, "followed" if done is not None else "took the lead")
    return (done, run_id, time.monotonic() - start) if done is not None else None


def follower_summary(
    store: Store, request: SearchRequest, run_id: int, done: Followed, elapsed: float, trials: int
) -> SearchSummary:
    """A follower's summary: how its leader's search ended, and the study as stored (its best, its counts)."""
    name = request.study_name
    rows = store.probes(name)
    return SearchSummary(
        study_name=name,
        run_id=run_id,
        elapsed_s=elapsed,
        stop_reason=f"followed {done.leader}: {done.message}",
        counts=store.count_probes(name),
        best=best_stable(rows),
        baseline=baseline_row(rows),
        probes_run=done.parts,
        probe_seconds=done.seconds,
        trials=trials,
    )


__all__ = ["follower_summary", "run_across_nodes"]
