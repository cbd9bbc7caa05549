"""A search across nodes as the storage hands it out (tuner.storage.nodes): the study's workers as nodes, its leader's
lease, the probes posted across nodes and each node's part of them, with the one rule for whether a node is there.

Liveness of a node: every worker of a study across nodes beats every ``NODE_BEAT_S`` (a thread of its own, during a
probe too); a node that has not beaten for ``NODE_STALE_S`` on the database's clock is gone (killed, frozen, cut off).
These are shorter than a search run's STALE_AFTER_S: a probe across nodes waits on its nodes, not on the Optuna trial.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

NODE_BEAT_S = 2.0
NODE_STALE_S = 12.0


@dataclass(frozen=True)
class NodeRow:
    """A worker of a study across nodes."""

    study_name: str
    worker: str  # host:pid
    address: str
    nproc: int
    joined_at: dt.datetime
    heartbeat_at: dt.datetime
    left_at: dt.datetime | None = None
    message: str | None = None

    def is_live(self, now: dt.datetime, stale_after: float = NODE_STALE_S) -> bool:
        return self.left_at is None and (now - self.heartbeat_at).total_seconds() <= stale_after

    def describe(self, now: dt.datetime) -> str:
        """The node in a line: its worker, address, and how long ago it beat (when it is gone)."""
        gone = f", left: {self.message}" if self.left_at is not None and self.message else ""
        silent = (now - self.heartbeat_at).total_seconds()
        quiet = f", silent for {silent:.0f} s" if silent > NODE_STALE_S and self.left_at is None else ""
        return f"{self.worker} at {self.address}{gone}{quiet}"

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> NodeRow:
        return cls(**{k: record[k] for k in cls.__dataclass_fields__ if k in record})


@dataclass(frozen=True)
class LeaseRow:
    """Who leads a study across nodes (runs its search and posts its probes), and whether its search ended."""

    study_name: str
    worker: str
    since: dt.datetime
    ended_at: dt.datetime | None = None
    message: str | None = None

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> LeaseRow:
        return cls(**{k: record[k] for k in cls.__dataclass_fields__ if k in record})


@dataclass(frozen=True)
class NodeProbeRow:
    """One probe across nodes as posted: where its rendezvous is, which nodes it waits for, its config (ProbeConfig as
    JSON), and whether it was told to stop or is closed."""

    id: int
    study_name: str
    leader: str
    endpoint: str
    rdzv_id: str
    nodes: tuple[str, ...]
    config: dict[str, Any]
    join_timeout_s: float
    posted_at: dt.datetime
    stop_at: dt.datetime | None = None
    stop_reason: str | None = None
    closed_at: dt.datetime | None = None
    result: dict[str, Any] | None = None  # the merged ProbeResult, once closed

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> NodeProbeRow:
        values = {k: record[k] for k in cls.__dataclass_fields__ if k in record}
        values["nodes"] = tuple(values.get("nodes") or ())
        values["config"] = dict(values.get("config") or {})
        return cls(**values)


@dataclass(frozen=True)
class NodePartRow:
    """One node's part of a probe across nodes: joined, and once finished its report (NodePart as JSON)."""

    probe_id: int
    worker: str
    joined_at: dt.datetime
    finished_at: dt.datetime | None = None
    result: dict[str, Any] | None = field(default=None)

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> NodePartRow:
        return cls(**{k: record[k] for k in cls.__dataclass_fields__ if k in record})


__all__ = ["NODE_BEAT_S", "NODE_STALE_S", "LeaseRow", "NodePartRow", "NodeProbeRow", "NodeRow"]
