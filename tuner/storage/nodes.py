"""Reads and writes of a search across nodes: the study's nodes and their beats, the leader's lease, the probes posted
across nodes and their parts (tuner_nodes, tuner_node_leases, tuner_node_probes, tuner_node_parts).

Every decision that two workers could race on is one statement the database settles: the lease is an INSERT on the
study's primary key, taken over from a stale leader by an UPDATE that still finds it (compare-and-swap); a node joins
a probe by an INSERT on (probe, worker); the first stop reason wins by an UPDATE where none is set. Times are the
database's clock (tuner.storage.store.db_time), so hosts whose clocks disagree agree on who is stale.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from tuner.errors import StorageError
from tuner.records.nodes import NODE_STALE_S, LeaseRow, NodePartRow, NodeProbeRow, NodeRow
from tuner.storage.schema import node_leases, node_parts, node_probes, nodes
from tuner.storage.store import Store, db_time


class NodeStore:
    """The node tables of ``store``'s database (its engine and clock)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.engine = store.engine

    def _now(self) -> sa.ColumnElement[Any]:
        return db_time(self.engine.dialect.name)

    def db_now(self) -> dt.datetime:
        return self.store.db_now()

    # -- nodes -------------------------------------------------------------------------------------------------------
    def register(self, study: str, worker: str, address: str, nproc: int) -> None:
        """``worker`` is a node of ``study`` (again: a row it left is taken back)."""
        values = {"address": address, "nproc": nproc, "heartbeat_at": self._now(), "left_at": None, "message": None}
        try:
            with self.engine.begin() as conn:
                conn.execute(sa.insert(nodes).values(study_name=study, worker=worker, joined_at=self._now(), **values))
        except IntegrityError:
            with self.engine.begin() as conn:
                conn.execute(sa.update(nodes).where(*self._node(study, worker)).values(**values))

    def _node(self, study: str, worker: str) -> tuple[sa.ColumnElement[bool], ...]:
        return nodes.c.study_name == study, nodes.c.worker == worker

    def beat(self, study: str, worker: str) -> None:
        with self.engine.begin() as conn:
            res = conn.execute(sa.update(nodes).where(*self._node(study, worker)).values(heartbeat_at=self._now()))
        if res.rowcount != 1:
            raise StorageError(f"node {worker} of study {study!r} is gone from the storage; was the database reset?")

    def leave(self, study: str, worker: str, message: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                sa.update(nodes).where(*self._node(study, worker)).values(left_at=self._now(), message=message[:2000])
            )

    def nodes(self, study: str) -> list[NodeRow]:
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(nodes).where(nodes.c.study_name == study).order_by(nodes.c.id)).all()
        return [NodeRow.from_record(dict(r._mapping)) for r in rows]

    def live_nodes(self, study: str, stale_after: float = NODE_STALE_S) -> list[NodeRow]:
        now = self.db_now()
        return [n for n in self.nodes(study) if n.is_live(now, stale_after)]

    # -- the lease ---------------------------------------------------------------------------------------------------
    def lease(self, study: str) -> LeaseRow | None:
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(node_leases).where(node_leases.c.study_name == study)).first()
        return LeaseRow.from_record(dict(row._mapping)) if row else None

    def lead(self, study: str, worker: str, stale_after: float = NODE_STALE_S) -> bool:
        """True when ``worker`` leads ``study`` now: it took the free lease, already held it, or took it over from a
        leader that stopped beating (compare-and-swap: of several taking over at once, one wins). A lease whose
        search ended is taken by nobody (False)."""
        held = self.lease(study)
        if held is None:  # free (an INSERT only then: a follower asks every half second)
            try:
                with self.engine.begin() as conn:
                    conn.execute(sa.insert(node_leases).values(study_name=study, worker=worker, since=self._now()))
                return True
            except IntegrityError:  # another worker took it between the read and the INSERT
                held = self.lease(study)
        if held is None or held.ended_at is not None:
            return False
        if held.worker == worker:
            return True
        owner = next((n for n in self.nodes(study) if n.worker == held.worker), None)
        if owner is not None and owner.is_live(self.db_now(), stale_after):
            return False
        with self.engine.begin() as conn:
            res = conn.execute(
                sa.update(node_leases)
                .where(node_leases.c.study_name == study, node_leases.c.worker == held.worker)
                .where(node_leases.c.ended_at.is_(None))
                .values(worker=worker, since=self._now())
            )
        return res.rowcount == 1

    def end_lease(self, study: str, worker: str, message: str) -> None:
        """The leader's search ended: its followers stop."""
        with self.engine.begin() as conn:
            conn.execute(
                sa.update(node_leases)
                .where(node_leases.c.study_name == study, node_leases.c.worker == worker)
                .values(ended_at=self._now(), message=message[:2000])
            )

    def reopen_lease(self, study: str) -> None:
        """A new search of a study whose earlier search across nodes ended: its lease is free again."""
        with self.engine.begin() as conn:
            conn.execute(
                sa.delete(node_leases).where(node_leases.c.study_name == study, node_leases.c.ended_at.is_not(None))
            )

    # -- probes and parts --------------------------------------------------------------------------------------------
    def post(
        self,
        study: str,
        leader: str,
        endpoint: str,
        rdzv_id: str,
        expected: Sequence[str],
        config: dict[str, Any],
        join_timeout_s: float,
    ) -> int:
        with self.engine.begin() as conn:
            res = conn.execute(
                sa.insert(node_probes).values(
                    study_name=study,
                    leader=leader,
                    endpoint=endpoint,
                    rdzv_id=rdzv_id,
                    nodes=list(expected),
                    config=config,
                    join_timeout_s=join_timeout_s,
                    posted_at=self._now(),
                )
            )
            key = res.inserted_primary_key
            assert key is not None
            return int(key[0])

    def open_probes(self, study: str) -> list[NodeProbeRow]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(node_probes)
                .where(node_probes.c.study_name == study, node_probes.c.closed_at.is_(None))
                .order_by(node_probes.c.id)
            ).all()
        return [NodeProbeRow.from_record(dict(r._mapping)) for r in rows]

    def probe(self, probe_id: int) -> NodeProbeRow:
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(node_probes).where(node_probes.c.id == probe_id)).first()
        if row is None:
            raise StorageError(f"probe {probe_id} across nodes is gone from the storage; was the database reset?")
        return NodeProbeRow.from_record(dict(row._mapping))

    def join(self, probe_id: int, worker: str) -> bool:
        """``worker`` takes its part in the probe (False: it had already)."""
        try:
            with self.engine.begin() as conn:
                conn.execute(sa.insert(node_parts).values(probe_id=probe_id, worker=worker, joined_at=self._now()))
        except IntegrityError:
            return False
        return True

    def report(self, probe_id: int, worker: str, result: dict[str, Any]) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                sa.update(node_parts)
                .where(node_parts.c.probe_id == probe_id, node_parts.c.worker == worker)
                .values(finished_at=self._now(), result=result)
            )

    def parts(self, probe_id: int) -> list[NodePartRow]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(node_parts).where(node_parts.c.probe_id == probe_id).order_by(node_parts.c.id)
            ).all()
        return [NodePartRow.from_record(dict(r._mapping)) for r in rows]

    def stop(self, probe_id: int, reason: str) -> None:
        """Every node of the probe stops (the first reason given is kept)."""
        with self.engine.begin() as conn:
            conn.execute(
                sa.update(node_probes)
                .where(node_probes.c.id == probe_id, node_probes.c.stop_at.is_(None))
                .values(stop_at=self._now(), stop_reason=reason[:2000])
            )

    def close(self, probe_id: int, result: dict[str, Any] | None = None) -> None:
        """The probe is over (``result``: the leader's verdict over every node, kept with it)."""
        with self.engine.begin() as conn:
            conn.execute(
                sa.update(node_probes)
                .where(node_probes.c.id == probe_id, node_probes.c.closed_at.is_(None))
                .values(closed_at=self._now(), result=result)
            )


__all__ = ["NodeStore"]
