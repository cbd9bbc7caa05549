"""The probes of a search across nodes, kept in step through the study's database.

The leader posts each probe (tuner_node_probes: its config, the c10d endpoint on the leader's address, the nodes it
waits for); every node's worker joins it and runs its own part (tuner.probing.agent.run_part: its torchrun agent and
its ranks), the leader's agent hosting the rendezvous store. One probe, one deadline, one verdict:

* every node kills its own ranks at the probe's timeout, after one of its ranks failed (it sets the probe's stop
  reason, so the other nodes stop too, each after FAILURE_GRACE_S), or when the stop reason is set by another node or
  by the leader (a node that did not join within the join window, a node that stopped beating, the leader gone);
* each node reports its part (its ranks' accounts, keyed by node and local rank); the leader merges every part
  (tuner.probing.node_verdict): a node that never reported makes the probe "killed" (no verdict on the config, run
  once more once the nodes are back), a node whose ranks never started a launch failure; two launches in a row whose
  ranks could not start stop the search with a NodeError naming the nodes and what their torchrun said.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from trials.contract import ProbeConfig, ProbeResult, Status
from tuner.errors import NodeError
from tuner.probing import gpus
from tuner.probing.accounts import NodePart
from tuner.probing.agent import NodeLaunch, Peers, failed_status, run_part
from tuner.probing.environment import probe_env, resolve_hub_model
from tuner.probing.local_nodes import node_env
from tuner.probing.node_verdict import differences, merge_nodes
from tuner.probing.ops import ensure_ops
from tuner.probing.ops import refusal as ops_refusal
from tuner.probing.ranks import FAILURE_GRACE_S
from tuner.probing.tempdirs import owned_dir
from tuner.records.nodes import NodeProbeRow
from tuner.session.nodes import Member
from tuner.settings import Settings
from tuner.storage.faults import is_connection_loss

REPORT_S = 30.0  # past its own part's end, how long the leader waits for a node's report
PEER_READ_S = 0.5  # a node reads the probe's stop reason at most this often
MAX_ATTEMPTS = 2


def free_port_on(address: str) -> int:
    """A TCP port free right now on ``address`` (the rendezvous store's)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family) as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


class DbPeers(Peers):
    """A node's Peers through the database: the probe's stop reason, and its role's own check (``check``: the leader
    watches the nodes, a follower the leader); a reason found by the check is set on the probe for every node."""

    def __init__(self, member: Member, probe_id: int, check: Callable[[], str | None]) -> None:
        self.member, self.probe_id, self.check = member, probe_id, check
        self.reason: str | None = None
        self._read = 0.0

    def stop_reason(self) -> str | None:
        now = time.monotonic()
        if self.reason is not None or now - self._read < PEER_READ_S:
            return self.reason
        self._read = now
        try:
            said = self.member.nodes.probe(self.probe_id).stop_reason
            found = said or self.check()
            if found is not None and said is None:
                self.member.nodes.stop(self.probe_id, found)
        except Exception as err:  # a lost connection: read again next time (the deadline still holds)
            if not is_connection_loss(err):
                raise
            return None
        self.reason = found
        return found

    def announce(self, reason: str) -> None:
        self.reason = self.reason or reason
        with contextlib.suppress(Exception):  # the database away: the others' own deadlines still hold
            self.member.nodes.stop(self.probe_id, reason)


def take_part(settings: Settings, member: Member, row: NodeProbeRow, peers: Peers) -> NodePart:
    """This node's part of the posted probe ``row`` (its ops built first, its GPUs held), in a folder of its own."""
    config = ProbeConfig.model_validate(row.config)
    launch = NodeLaunch(
        node=member.worker,
        address=member.address,
        endpoint=row.endpoint,
        rdzv_id=row.rdzv_id,
        is_host=row.leader == member.worker,
        join_timeout_s=row.join_timeout_s,
    )
    try:
        base = probe_env(config.nproc_per_node, settings=settings)
        env = node_env(config, base, {**resolve_hub_model(config.model), **forkserver_env(settings)})
        refused = ops_refusal(ensure_ops(config, base))
    except OSError as exc:
        refused = f"could not prepare the probe: {exc}"
    if refused is not None:
        return _not_started(member, config, peers, refused)
    visible, physical, _ = gpus.host_visible_devices()
    names = gpus.lock_names(config.nproc_per_node, visible, gpus.gpu_uuid) if physical else []
    work = owned_dir("tuner-node-")
    try:
        with gpus.gpu_locks(names, timeout_s=config.timeout_s) as free:
            if not free:
                said = f"GPUs {', '.join(names)} stayed held by another probe on node {member.worker}"
                peers.announce(said)
                return NodePart(
                    node=member.worker, address=member.address, nproc=config.nproc_per_node, agent_said=said
                )
            return run_part(config, launch, env, work, peers)
    except OSError as exc:
        said = f"could not start torchrun on node {member.worker}: {exc}"
        peers.announce(said)
        return NodePart(node=member.worker, address=member.address, nproc=config.nproc_per_node, agent_said=said)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def forkserver_env(settings: Settings) -> dict[str, str]:
    """Where this worker's preloaded fork server listens, for its node's ranks to be forked from (trials.node_rank;
    the launcher setting decides, as on one host); empty: fresh interpreters."""
    from trials.node_rank import FORKSERVER_ENV
    from tuner.probing import forkserver
    from tuner.probing.runner import choose_launcher

    if choose_launcher(None, settings) != "forkserver":
        return {}
    try:
        return {FORKSERVER_ENV: str(forkserver.get_server(probe_env(1, settings=settings)).path)}
    except OSError:
        forkserver.disable()
        return {}


def _not_started(member: Member, config: ProbeConfig, peers: Peers, said: str) -> NodePart:
    """This node's part when its ranks could not start: the other nodes stop, the part says why."""
    peers.announce(f"node {member.worker}: {said}")
    return NodePart(node=member.worker, address=member.address, nproc=config.nproc_per_node, agent_said=said)


class _LeaderCheck:
    """What the leader watches during a probe: every expected node joins within the join window, and none that joined
    stops beating."""

    def __init__(self, member: Member, probe_id: int, expected: list[str], join_s: float) -> None:
        self.member, self.probe_id, self.expected, self.join_s = member, probe_id, expected, join_s
        self.start = time.monotonic()

    def __call__(self) -> str | None:
        nodes = self.member.nodes
        joined = {p.worker for p in nodes.parts(self.probe_id)}
        late = [w for w in self.expected if w not in joined]
        if late and time.monotonic() - self.start > self.join_s:
            return f"node {', '.join(late)} did not join the probe within {self.join_s:g} s"
        gone = self.member.gone(w for w in self.expected if w in joined)
        return f"node {', '.join(gone)} stopped beating during the probe" if gone else None


class NodeProbe:
    """The leader's probe launcher across nodes: ``probe(config)`` returns the merged ProbeResult of every node's
    part; a probe no node could start twice in a row raises NodeError (so does a node that does not come back)."""

    def __init__(self, settings: Settings, member: Member, note: Callable[[str], None] | None = None) -> None:
        self.settings, self.member = settings, member
        self.note = note or (lambda text: None)
        self._said: set[str] = set()

    def env(self, world_size: int) -> dict[str, str]:
        return probe_env(world_size, settings=self.settings)

    def __call__(self, config: ProbeConfig) -> ProbeResult:
        refused = ops_refusal(ensure_ops(config, self.env(config.nproc_per_node)))
        if refused is not None:
            return ProbeResult(status=Status.REFUSED, cause=refused)
        result, launched = self._attempt(config)
        if result.status.transient or not launched:
            self.note(f"probe across nodes: {result.cause}; running it again")
            result, launched = self._attempt(config)
            result = result.model_copy(update={"attempts": 2})
        if not launched:
            raise NodeError(f"{result.cause}; check that every node reaches {self.member.address} (TUNER_NODE_ADDRESS)")
        return result

    def _attempt(self, config: ProbeConfig) -> tuple[ProbeResult, bool]:
        member, nodes = self.member, self.member.nodes
        live = member.wait_for_nodes()
        expected = [n.worker for n in live]
        join_s = self.settings.node_timeout_s
        endpoint = f"{member.address}:{free_port_on(member.address)}"
        rdzv = f"tuner-{uuid.uuid4().hex[:16]}"
        config_json = config.model_dump(mode="json")
        probe_id = nodes.post(member.study, member.worker, endpoint, rdzv, expected, config_json, join_s)
        nodes.join(probe_id, member.worker)
        start = time.monotonic()
        result: ProbeResult | None = None
        launched = False
        try:
            peers = DbPeers(member, probe_id, _LeaderCheck(member, probe_id, expected, join_s))
            part = take_part(self.settings, member, nodes.probe(probe_id), peers)
            nodes.report(probe_id, member.worker, part.model_dump(mode="json"))
            end = time.monotonic() + FAILURE_GRACE_S + REPORT_S
            parts, lost = self._collect(probe_id, expected, join_s, start, end)
            result, launched = merge_nodes(config, parts, lost, time.monotonic() - start)
        finally:  # the verdict kept with the posted probe (a lost node's probe too: it runs again, unstored)
            nodes.close(probe_id, result.model_dump(mode="json") if result is not None else None)
        said = differences(result.nodes)
        if said and said not in self._said:
            self._said.add(said)
            self.note(said)
        return result, launched

    def _collect(
        self, probe_id: int, expected: list[str], join_s: float, start: float, end: float
    ) -> tuple[list[NodePart], list[str]]:
        """The parts reported, and the nodes that never will: not joined within the join window, stopped beating,
        or silent past ``end``."""
        nodes = self.member.nodes
        while True:
            rows = {p.worker: p for p in nodes.parts(probe_id)}
            parts = [NodePart.model_validate(rows[w].result) for w in expected if w in rows and rows[w].result]
            missing = [w for w in expected if not (w in rows and rows[w].result)]
            if not missing:
                return parts, []
            late = time.monotonic() - start > join_s
            gone = set(self.member.gone(missing))
            lost = [w for w in missing if w in gone or (w not in rows and late)]
            if len(lost) == len(missing) or time.monotonic() > end:
                return parts, missing
            time.sleep(PEER_READ_S)


def follower_check(member: Member, leader: str) -> Callable[[], str | None]:
    """What a follower watches during a probe: its leader still beats."""

    def check() -> str | None:
        return f"the leader {leader} stopped beating" if member.gone([leader]) else None

    return check


@dataclass(frozen=True)
class Followed:
    """What a follower did: whose search it followed, how that search ended, the parts it ran and their seconds."""

    leader: str | None
    message: str
    parts: int
    seconds: float


FOLLOW_POLL_S = 0.5


def follow(
    settings: Settings, member: Member, budget_left: Callable[[], float], note: Callable[[str], None]
) -> Followed | None:
    """Runs this node's part of every probe the leader posts for it, until the leader's search ended (Followed), or
    this worker took the lead (None: its leader stopped beating, or there was none). A follower whose own budget is
    over stays while a live leader may still need it, ``timeout_s`` at most past it."""
    done = _Done()
    lost_since: float | None = None
    while True:
        try:
            outcome = _follow_once(settings, member, budget_left, note, done)
            lost_since = None
        except Exception as err:  # the database away: wait for it (as long as a node waits for its peers)
            if not is_connection_loss(err):
                raise
            lost_since = lost_since or time.monotonic()
            if time.monotonic() - lost_since > member.timeout_s:
                raise
            outcome = "go on"
        if outcome == "lead":
            return None
        if isinstance(outcome, Followed):
            return outcome
        time.sleep(FOLLOW_POLL_S)


@dataclass
class _Done:
    parts: int = 0
    seconds: float = 0.0


def _follow_once(
    settings: Settings, member: Member, budget_left: Callable[[], float], note: Callable[[str], None], done: _Done
) -> Followed | Literal["lead", "go on"]:
    """One look at the study: Followed (the search ended), "lead" (this worker leads now), or "go on"."""
    nodes = member.nodes
    lease = nodes.lease(member.study)
    if lease is not None and lease.ended_at is not None:
        return Followed(lease.worker, lease.message or "ended", done.parts, done.seconds)
    if member.lead():
        return "lead"
    for row in nodes.open_probes(member.study):
        if member.worker not in row.nodes or not nodes.join(row.id, member.worker):
            continue
        start = time.monotonic()
        peers = DbPeers(member, row.id, follower_check(member, row.leader))
        part = take_part(settings, member, row, peers)
        nodes.report(row.id, member.worker, part.model_dump(mode="json"))
        done.parts, done.seconds = done.parts + 1, done.seconds + time.monotonic() - start
        note(_part_line(row, part, time.monotonic() - start))
    if budget_left() < -member.timeout_s:
        return Followed(lease.worker if lease else None, "this worker's budget is over", done.parts, done.seconds)
    return "go on"


def _part_line(row: NodeProbeRow, part: NodePart, seconds: float) -> str:
    knobs = ProbeConfig.model_validate(row.config).knobs
    what = f"{knobs.engine_label}, micro {knobs.micro_batch_size}"
    worst = failed_status(part)
    said = f"ranks {worst}" if worst is not None else ("ranks ok" if part.started else "no rank started")
    stop = f" (stopped: {part.stopped})" if part.stopped else ""
    return f"node part of probe {row.id} ({what}): {said} in {seconds:.0f} s{stop}"


__all__ = ["DbPeers", "Followed", "NodeProbe", "follow", "follower_check", "free_port_on", "take_part"]
