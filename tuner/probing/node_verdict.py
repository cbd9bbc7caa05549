"""One verdict over every rank of every node of a probe across nodes (pure).

Each node's worker reports its part (tuner.probing.accounts.NodePart); the leader merges them here:

1. a node that was lost during the probe (its worker stopped beating, so it never reported) makes the probe "killed":
   nothing about the config was learned (its peers failed in collectives because it went away), so it may run again;
2. a node none of whose ranks started (torchrun ended in its rendezvous, or before its workers) makes it a launch
   failure ("error", ``launched`` False), naming the node and what its torchrun said last;
3. else the ranks' accounts of all nodes merge as one host's do (tuner.probing.verdict.merge_accounts): the most telling
   failure names the probe, and the cause names the rank by node and local rank.

Each node's fingerprint and versions come back with the probe (ProbeResult.nodes); ``differences`` says where nodes
differ (a probe across unlike nodes measures the slowest, and a library that differs changes the memory).
"""

from __future__ import annotations

from collections.abc import Sequence

from trials.contract import ProbeConfig, ProbeNode, ProbeResult, Status
from tuner.probing.accounts import NodePart, RankAccount
from tuner.probing.verdict import merge_accounts

#: what two nodes of one probe should agree on: the hardware of their fingerprints and the library versions
COMPARED_FINGERPRINT = ("gpu_name", "gpu_count", "gpu_capacity", "driver", "nccl", "device", "cuda")


def probe_node(part: NodePart) -> ProbeNode:
    """A node of the probe as the result keeps it: its name, address, ranks, fingerprint and versions."""
    first = next((a.result for a in part.accounts if a.result is not None), None)
    return ProbeNode(
        name=part.node,
        address=part.address,
        ranks={a.local_rank: a.rank for a in part.accounts if a.rank is not None},
        fingerprint=first.fingerprint if first else {},
        versions=first.versions if first else {},
    )


def merge_nodes(
    config: ProbeConfig, parts: Sequence[NodePart], lost: Sequence[str], wall_s: float
) -> tuple[ProbeResult, bool]:
    """(the probe's result, whether its ranks were launched on every node) from the parts reported and the nodes
    ``lost`` (named by the leader: they never reported)."""
    nodes = [probe_node(p) for p in parts]
    timed_out = any(p.timed_out for p in parts)
    accounts = [_after_timeout(a) if timed_out else a for p in parts for a in p.accounts]
    merged = merge_accounts(config, accounts, timed_out, wall_s, nodes)
    if lost:
        cause = (
            f"node {', '.join(lost)} was lost during the probe (its worker stopped reporting): no verdict on the "
            f"config; {_first_failure(merged)}"
        )
        return _failed(merged, Status.KILLED, cause), True
    silent = [p for p in parts if p.started == 0]
    if silent:
        said = "; ".join(f"node {p.node}: torchrun said: {p.agent_said or 'nothing'}" for p in silent)
        cause = f"the ranks of {len(silent)} of {len(parts)} node(s) never started (c10d rendezvous failed): {said}"
        return _failed(merged, Status.ERROR, cause), False
    return merged, True


#: what a rank says when a peer on another node went away under it (its node killed it at its own deadline): gloo's
#: and c10d's words for a closed connection
PEER_GONE = (
    "DistNetworkError",
    "Connection was likely closed",
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
)


def _after_timeout(a: RankAccount) -> RankAccount:
    """A rank's end in a probe a node killed at its deadline: a closed connection is a peer going away under it (each
    node keeps its own clock: another node's deadline can come first, its ranks killed while this one still waits),
    a timeout too. Any other failure is its own (e.g. an error long before the deadline that left the others
    waiting)."""
    if a.status == Status.ERROR and any(word in (a.cause or "") for word in PEER_GONE):
        return a.model_copy(update={"status": Status.TIMEOUT})
    return a


def _first_failure(merged: ProbeResult) -> str:
    if merged.status == Status.OK:
        return "its ranks had finished"
    return f"the ranks left said: {merged.cause or merged.status}"


def _failed(merged: ProbeResult, status: Status, cause: str) -> ProbeResult:
    """``merged`` with no verdict of its own: ``status`` and ``cause``, no throughput."""
    update = {"status": status, "cause": cause[:2000], "phase": None}
    return merged.model_copy(update={**update, "samples_per_s": None, "tokens_per_s": None, "steps": None})


def differences(nodes: Sequence[ProbeNode]) -> str | None:
    """Where the nodes of a probe differ (hardware, library versions), in one line; None when they agree."""
    if len(nodes) < 2:
        return None
    said: list[str] = []
    keys = [("fingerprint", k) for k in COMPARED_FINGERPRINT] + [
        ("versions", k) for k in sorted({k for n in nodes for k in n.versions})
    ]
    for part, key in keys:
        values = {n.name: str(getattr(n, part).get(key, "-")) for n in nodes}
        if len(set(values.values())) > 1:
            said.append(f"{key} " + ", ".join(f"{v} on {name}" for name, v in values.items()))
    return "nodes differ: " + "; ".join(said) if said else None


__all__ = ["differences", "merge_nodes", "probe_node"]
