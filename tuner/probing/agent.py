"""One node's part of a probe across nodes: its ranks started by torchrun, supervised and killed by this node's worker.

Every node's worker starts one torchrun agent (``python -m trials.agent``: torchrun dying with the worker) on the
c10d rendezvous of the probe (``--rdzv-backend c10d --rdzv-endpoint <leader>:<port> --rdzv-id <probe>``; the leader's
agent hosts the store, ``is_host`` said explicitly, never guessed from host names). torchrun starts each local rank
as ``python -m trials.node_rank``, which runs the rank and leaves its pid, global rank and return code in the node's
folder: torchrun is the launcher, the worker only watches.

torchrun never kills another node's workers (a rank that hangs keeps its agent alive), so the probe's deadline and
its kill are the worker's, on every node: it kills its own ranks and agent at the probe's timeout, ``FAILURE_GRACE_S``
after one of its ranks failed (telling the other nodes through ``Peers.announce``), or ``FAILURE_GRACE_S`` after
another node or the leader said stop (``Peers.stop_reason``). Its ranks' accounts (tuner.probing.verdict.account)
come back in a ``NodePart``; the leader merges every node's.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from trials.contract import ProbeConfig, Status, rank_out_path
from trials.node_rank import rank_file
from tuner.probing import verdict
from tuner.probing.accounts import NodePart, RankAccount
from tuner.probing.forkserver import pid_alive
from tuner.probing.ranks import FAILURE_GRACE_S, Rank, kill_group

POLL_S = 0.1
AGENT_EXIT_S = 10.0  # after its ranks all ended, torchrun's exit barrier waits for the other nodes this long at most
KILLED_BY_US = -9


class Peers(Protocol):
    """How one node's part hears from, and speaks to, the probe's other nodes (the database across hosts;
    tuner.probing.local_nodes in one process)."""

    def stop_reason(self) -> str | None:
        """Why every node must stop now (a rank of another node failed, a node was lost, the leader said so), or
        None. Called often: an implementation limits its own reads."""

    def announce(self, reason: str) -> None:
        """This node saw a failure (or its torchrun ended before its ranks): every other node stops too."""


@dataclass(frozen=True)
class NodeLaunch:
    """Where one node's part of a probe meets the others: torchrun's c10d rendezvous."""

    node: str  # this node's name (its worker, host:pid)
    address: str  # this node's address, the one its peers reach it at (torchrun --local-addr)
    endpoint: str  # host:port of the rendezvous store (the leader's address)
    rdzv_id: str  # one per launch of a probe
    is_host: bool  # this node's agent hosts the store (the leader's)
    join_timeout_s: float  # how long its agent waits for every node at the rendezvous


def torchrun_argv(config: ProbeConfig, launch: NodeLaunch, work: Path) -> list[str]:
    """The node's agent: torchrun's own flags, no restarts, each local rank ``python -m trials.node_rank`` (pure)."""
    join = max(1, round(launch.join_timeout_s))
    conf = f"is_host={int(launch.is_host)},join_timeout={join},read_timeout={join},close_timeout=5"
    return [
        sys.executable,
        "-m",
        "trials.agent",
        f"--nnodes={config.nnodes}",
        f"--nproc-per-node={config.nproc_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={launch.endpoint}",
        f"--rdzv-id={launch.rdzv_id}",
        f"--rdzv-conf={conf}",
        f"--local-addr={launch.address}",
        "--max-restarts=0",
        "--monitor-interval=0.2",
        "-m",
        "trials.node_rank",
        str(work),
    ]


class NodeRankProc:
    """A rank torchrun started, seen from its node's worker (not its parent): its pid file and exit file."""

    def __init__(self, work: Path, local_rank: int, pid: int, wrapper: int) -> None:
        self.work, self.local_rank, self.pid, self.wrapper = work, local_rank, pid, wrapper
        self.returncode: int | None = None
        self.stopped = False  # torchrun stopped it (a peer failed first)
        self._gone_at: float | None = None

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        path = rank_file(self.work, self.local_rank, "exit")
        if path.exists():
            with contextlib.suppress(OSError, ValueError):
                said = json.loads(path.read_text())
                self.returncode, self.stopped = int(said["returncode"]), bool(said.get("stopped"))
                return self.returncode
        if not pid_alive(self.wrapper) and not pid_alive(self.pid):
            self._gone_at = self._gone_at or time.monotonic()
            if time.monotonic() - self._gone_at > 1.0:  # both gone and no word: killed with its wrapper
                self.returncode = KILLED_BY_US
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None and (end is None or time.monotonic() < end):
            time.sleep(POLL_S)
        return self.returncode


def _discover(work: Path, config: ProbeConfig, known: dict[int, Rank]) -> None:
    """Adds the local ranks that have started since the last look (their pid files)."""
    out = work / "result.json"
    for local in range(config.nproc_per_node):
        if local in known:
            continue
        path = rank_file(work, local, "pid")
        if not path.exists():
            continue
        with contextlib.suppress(OSError, ValueError, KeyError):
            said = json.loads(path.read_text())
            rank = int(said["rank"])
            proc = NodeRankProc(work, local, int(said["pid"]), int(said["wrapper"]))
            err = rank_file(work, local, "stderr")
            known[local] = Rank(rank, proc, rank_out_path(out, rank, config.world_size), err, local_rank=local)


def _kill(ranks: Sequence[Rank], agent: subprocess.Popen[bytes]) -> None:
    for r in ranks:
        if r.proc.poll() is None:
            r.killed_by_us = True
    for r in ranks:
        kill_group(r.proc.pid)
        if isinstance(r.proc, NodeRankProc):
            kill_group(r.proc.wrapper)
    kill_group(agent.pid)
    agent.wait()
    for r in ranks:
        r.proc.wait(5.0)


def _stopped_by_torchrun(r: Rank) -> bool:
    return isinstance(r.proc, NodeRankProc) and r.proc.stopped


class _Watch:
    """The supervision of one node's part: its deadline, its own ranks' failures, the other nodes' word."""

    def __init__(self, config: ProbeConfig, launch: NodeLaunch, peers: Peers, start: float) -> None:
        self.config, self.launch, self.peers = config, launch, peers
        self.deadline = start + config.timeout_s
        self.failed_at: float | None = None
        self.stop_at: float | None = None
        self.stopped: str | None = None
        self.done_at: float | None = None
        self.timed_out = False

    def failing(self, ranks: Sequence[Rank], now: float) -> None:
        if self.failed_at is not None:
            return
        bad = next((r for r in ranks if r.failed() and not _stopped_by_torchrun(r)), None)
        if bad is not None:
            self.failed_at = now
            self.peers.announce(f"rank {bad.rank} of node {self.launch.node} failed")

    def told(self, now: float) -> None:
        if self.stop_at is None:
            reason = self.peers.stop_reason()
            if reason is not None:
                self.stop_at, self.stopped = now, reason

    def must_kill(self, ranks: Sequence[Rank], agent_done: bool, now: float) -> bool:
        self.timed_out = now >= self.deadline
        after = [t for t in (self.failed_at, self.stop_at) if t is not None]
        if self.timed_out or any(now - t >= FAILURE_GRACE_S for t in after):
            return True
        finished = len(ranks) == self.config.nproc_per_node and all(r.proc.poll() is not None for r in ranks)
        if finished and not agent_done:  # torchrun's exit barrier: it may wait for the other nodes
            self.done_at = self.done_at or now
            return now - self.done_at >= AGENT_EXIT_S
        return False


def run_part(config: ProbeConfig, launch: NodeLaunch, env: dict[str, str], work: Path, peers: Peers) -> NodePart:
    """Runs this node's part of ``config`` in ``work`` (its own folder) with ``env`` (tuner.probing.ranks.rank_env
    without the rendezvous variables: torchrun sets them), until every local rank and the agent ended or were killed.
    Raises OSError when torchrun cannot be started."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "probe.json").write_text(config.model_dump_json(indent=1))
    start = time.monotonic()
    with open(work / "agent.stdout", "wb") as so, open(work / "agent.stderr", "wb") as se:
        agent = subprocess.Popen(
            torchrun_argv(config, launch, work),
            env=env,
            stdout=so,
            stderr=se,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=str(work),
        )
    ranks: dict[int, Rank] = {}
    watch = _Watch(config, launch, peers, start)
    try:
        while True:
            _discover(work, config, ranks)
            now = time.monotonic()
            agent_done = agent.poll() is not None
            running = [r for r in ranks.values() if r.proc.poll() is None]
            if agent_done and not running:
                if len(ranks) < config.nproc_per_node:
                    peers.announce(f"torchrun on node {launch.node} ended before its ranks started")
                break
            watch.failing(list(ranks.values()), now)
            watch.told(now)
            if watch.must_kill(list(ranks.values()), agent_done, now):
                break
            time.sleep(POLL_S)
    finally:
        _discover(work, config, ranks)
        _kill(list(ranks.values()), agent)
    return _part(config, launch, work, ranks, watch, agent, time.monotonic() - start)


def _part(
    config: ProbeConfig,
    launch: NodeLaunch,
    work: Path,
    ranks: dict[int, Rank],
    watch: _Watch,
    agent: subprocess.Popen[bytes],
    wall_s: float,
) -> NodePart:
    accounts: list[RankAccount] = []
    for local in range(config.nproc_per_node):
        r = ranks.get(local)
        if r is None:
            accounts.append(RankAccount(node=launch.node, local_rank=local))
            continue
        if _stopped_by_torchrun(r):
            r.killed_by_us = True  # torchrun stopped it after a peer failed: no status of its own
        accounts.append(verdict.account(r, watch.timed_out, None, node=launch.node))
    code = agent.returncode
    said = verdict.tail(work / "agent.stderr") if len(ranks) < config.nproc_per_node else ""
    return NodePart(
        node=launch.node,
        address=launch.address,
        accounts=accounts,
        nproc=config.nproc_per_node,
        timed_out=watch.timed_out,
        wall_s=wall_s,
        agent_code=code if code is not None and code >= 0 else None,
        agent_said=said,
        stopped=watch.stopped,
    )


def failed_status(part: NodePart) -> Status | None:
    """The worst status a node's own ranks ended with (None: none failed)."""
    failed = [Status(a.status) for a in part.accounts if a.status not in (None, Status.OK)]
    return max(failed, key=lambda s: s.severity, default=None)


__all__ = ["NodeLaunch", "Peers", "failed_status", "run_part", "torchrun_argv"]
