"""What one rank, and one node, of a probe came to: typed records the verdict merges (tuner.probing.verdict).

On one host the runner builds a ``RankAccount`` per rank from its files and exit code and merges them at once. Across
nodes each node's worker builds its own ranks' accounts into a ``NodePart`` (tuner.probing.agent), the part travels
through the study's database to the leader, and the leader merges every node's accounts the same way: one verdict
over every rank of every node. Ranks are keyed by (node, local rank): with torchrun's c10d rendezvous the global rank
of a node's rank is decided by join order, and a rank that died before it said so has none.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from trials.contract import Phase, RankResult, Status


class RankAccount(BaseModel):
    """One rank's end as its node saw it: its status and cause (tuner.probing.verdict.rank_status's order), its result
    file, where it was, what it said last. ``status`` None: stopped by us after a peer failed (no status of its own)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    node: str = ""  # the node's name (a worker's host:pid); "" on one host
    local_rank: int = Field(ge=0)
    rank: int | None = None  # the global rank (None: it never said, e.g. it died before starting)
    status: Status | None = None
    cause: str | None = None
    result: RankResult | None = None
    phase: Phase | None = None
    said: str = ""  # its stderr tail and NCCL's last warnings (tuner.probing.verdict.said_tail)
    launch_fault: bool = False

    @property
    def label(self) -> str:
        """How a cause names the rank: ``rank 3`` on one host, ``rank 3 (node a:12, local 1)`` across nodes."""
        if not self.node:
            return f"rank {self.rank if self.rank is not None else self.local_rank}"
        where = f"node {self.node}, local rank {self.local_rank}"
        return f"rank {self.rank} ({where})" if self.rank is not None else where

    @property
    def order(self) -> int:
        """Sort key among failures of one severity: the lowest global rank first (a rank without one last)."""
        return self.rank if self.rank is not None else 1 << 30


class NodePart(BaseModel):
    """One node's part of a probe across nodes, as its worker reports it to the leader (tuner_node_parts.result)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    node: str
    address: str = ""
    accounts: list[RankAccount] = Field(default_factory=list)
    nproc: int = Field(1, ge=1)  # the ranks this node was to start
    timed_out: bool = False
    wall_s: float = 0.0
    agent_code: int | None = None  # torchrun's exit code (None: killed by us, or still running when the part ended)
    agent_said: str = ""  # torchrun's last words when it ended before every rank of this node started
    stopped: str | None = None  # the reason another node (or the leader) gave for stopping, when this node acted on it

    @property
    def started(self) -> int:
        """The ranks of this node that started (said their global rank)."""
        return sum(1 for a in self.accounts if a.rank is not None)


__all__ = ["NodePart", "RankAccount"]
