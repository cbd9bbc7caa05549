"""This worker as one node of a study across nodes: registered with the address its peers reach it at, beating on a
thread of its own, leading the search or following it.

One tuner worker runs on every node (the same `tuner search ... --nnodes N --nproc-per-node G`, or ``srun -N N
--ntasks-per-node 1 tuner search ...``); no ssh, no pdsh: each worker starts only its own node's processes. They meet
in the study's database (tuner.storage.nodes): the first to take the study's lease leads (runs the search, posts each
probe: tuner.session.node_probe), the others follow (run their part of each probe). A leader that stops beating loses
the lease to the first follower that sees it (compare-and-swap), which resumes the study from its stored rows.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterable

from tuner.errors import NodeError
from tuner.records.nodes import NODE_BEAT_S, NodeRow
from tuner.storage import Store
from tuner.storage.nodes import NodeStore

WAIT_POLL_S = 0.5


def route_address(storage_url: str) -> str:
    """The address this host reaches the storage from (the source address of a route to its server): the one every
    other node, which reaches the same storage, can most likely reach this one at. 127.0.0.1 for a local server."""
    from sqlalchemy.engine import make_url

    parsed = make_url(storage_url)
    host = parsed.host or "127.0.0.1"
    try:
        info = socket.getaddrinfo(host, parsed.port or 5432, type=socket.SOCK_DGRAM)[0]
        with socket.socket(info[0], socket.SOCK_DGRAM) as s:
            s.connect(info[4])
            return str(s.getsockname()[0])
    except OSError:
        return socket.gethostname()


class Member:
    """This worker as one node of ``study``: ``with Member(...)`` registers it and beats (its node row, and its search
    run ``run_id`` once set) every NODE_BEAT_S until it leaves."""

    def __init__(
        self,
        store: Store,
        study: str,
        worker: str,
        address: str,
        *,
        nnodes: int,
        nproc: int,
        timeout_s: float,
        nodelist: str = "",
    ) -> None:
        self.store, self.nodes = store, NodeStore(store)
        self.study, self.worker, self.address = study, worker, address
        self.nnodes, self.nproc, self.timeout_s, self.nodelist = nnodes, nproc, timeout_s, nodelist
        self.run_id: int | None = None
        self.message = "left"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="tuner-node-beat", daemon=True)

    def __enter__(self) -> Member:
        lease = self.nodes.lease(self.study)
        if lease is not None and lease.ended_at is not None:  # an earlier search of the study ended: a new one
            self.nodes.reopen_lease(self.study)
        self.nodes.register(self.study, self.worker, self.address, self.nproc)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        with contextlib.suppress(Exception):  # the database away: the node goes stale by itself
            self.nodes.leave(self.study, self.worker, self.message)

    def _beat(self) -> None:
        while not self._stop.wait(NODE_BEAT_S):
            try:
                self.nodes.beat(self.study, self.worker)
                if self.run_id is not None:
                    self.store.heartbeat(self.run_id)
            except Exception:  # the database is away: the next beat tries again
                continue

    # -- leading -----------------------------------------------------------------------------------------------------
    def lead(self) -> bool:
        """True when this worker leads the study now (took the lease, or took it over from a leader gone silent:
        the probes that leader left open are closed)."""
        if not self.nodes.lead(self.study, self.worker):
            return False
        for row in self.nodes.open_probes(self.study):
            if row.leader != self.worker:
                self.nodes.stop(row.id, f"its leader {row.leader} is gone")
                self.nodes.close(row.id)
        return True

    def end(self, message: str) -> None:
        """The search this worker led ended (``message``: why): its followers stop."""
        self.nodes.end_lease(self.study, self.worker, message)

    # -- the other nodes ---------------------------------------------------------------------------------------------
    def gone(self, workers: Iterable[str]) -> list[str]:
        """Those of ``workers`` that are no longer live nodes (stopped beating, left, or unknown)."""
        wanted = list(workers)
        if not wanted:
            return []
        live = {n.worker for n in self.nodes.live_nodes(self.study)}
        return [w for w in wanted if w not in live]

    def wait_for_nodes(self) -> list[NodeRow]:
        """The nodes of the next probe: this one first, then the other live ones in the order they joined, once there
        are ``nnodes``; NodeError naming who is there and who is not after ``timeout_s``."""
        end = time.monotonic() + self.timeout_s
        while True:
            live = self.nodes.live_nodes(self.study)
            mine = [n for n in live if n.worker == self.worker]
            others = sorted((n for n in live if n.worker != self.worker), key=lambda n: n.joined_at)
            chosen = (mine + others)[: self.nnodes]
            if len(chosen) == self.nnodes and mine:
                return chosen
            if time.monotonic() > end:
                raise NodeError(self.missing_line(live))
            time.sleep(WAIT_POLL_S)

    def missing_line(self, live: list[NodeRow]) -> str:
        """Who is there and who is not, in one line, with what to start."""
        now = self.nodes.db_now()
        here = "; ".join(n.describe(now) for n in live) or "none"
        gone = [n for n in self.nodes.nodes(self.study) if n.worker not in {m.worker for m in live}]
        lost = f"; gone: {'; '.join(n.describe(now) for n in gone)}" if gone else ""
        slurm = f" (this Slurm step's nodes: {self.nodelist})" if self.nodelist else ""
        return (
            f"study {self.study!r} runs across {self.nnodes} nodes; {len(live)} of them beat after waiting "
            f"{self.timeout_s:g} s (here: {here}{lost}); start the same `tuner search --study {self.study} ...` on "
            f"every node{slurm}, e.g. srun -N {self.nnodes} --ntasks-per-node 1 tuner search ... (TUNER_NODE_TIMEOUT "
            "sets the wait)"
        )


__all__ = ["Member", "route_address"]
