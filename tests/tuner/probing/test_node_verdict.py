"""One verdict over every rank of every node (pure): a node lost is "killed" (no verdict), a node none of whose ranks
started is a launch failure naming it and what its torchrun said, else the worst rank names the probe by node and
local rank; nodes that differ are said."""

from __future__ import annotations

from trials.contract import Knobs, ProbeConfig, ProbeNode, RankMemory, RankResult, Status, StepStats
from tuner.probing.accounts import NodePart, RankAccount
from tuner.probing.node_verdict import differences, merge_nodes

CONFIG = ProbeConfig(knobs=Knobs(micro_batch_size=2, max_length=8, engine="fsdp2"), world_size=4, nnodes=2)
STEPS = StepStats(micro_mean_s=0.1, micro_p50_s=0.1, micro_max_s=0.1, optimizer_step_s=0.2, cycle_s=0.2)


def ok(node: str, local: int, rank: int, peak: int = 1000, torch: str = "2.13") -> RankAccount:
    result = RankResult(
        rank=rank,
        status=Status.OK,
        memory=RankMemory(rank=rank, peak_allocated=peak, peak_reserved=peak),
        steps=STEPS,
        versions={"torch": torch},
        fingerprint={"device": "cpu"},
    )
    return RankAccount(node=node, local_rank=local, rank=rank, status=Status.OK, result=result)


def part(node: str, *accounts: RankAccount, said: str = "") -> NodePart:
    return NodePart(node=node, address="10.0.0.1", accounts=list(accounts), nproc=2, agent_said=said)


def test_every_rank_of_every_node_in_one_result() -> None:
    parts = [part("b:2", ok("b:2", 0, 2), ok("b:2", 1, 3, peak=3000)), part("a:1", ok("a:1", 0, 0), ok("a:1", 1, 1))]
    result, launched = merge_nodes(CONFIG, parts, [], 10.0)
    assert launched and result.status == Status.OK and result.samples_per_s == CONFIG.global_batch / 0.2
    assert [m.rank for m in result.ranks] == [0, 1, 2, 3] and result.peak_allocated == 3000
    assert {n.name: n.ranks for n in result.nodes} == {"b:2": {0: 2, 1: 3}, "a:1": {0: 0, 1: 1}}


def test_the_worst_rank_names_the_probe_by_node_and_local_rank() -> None:
    oom = RankAccount(node="b:2", local_rank=1, rank=3, status=Status.OOM, cause="OutOfMemoryError: emulated")
    error = RankAccount(node="a:1", local_rank=0, rank=0, status=Status.ERROR, cause="gloo: connection closed")
    parts = [part("a:1", error, RankAccount(node="a:1", local_rank=1, rank=1)), part("b:2", ok("b:2", 0, 2), oom)]
    result, launched = merge_nodes(CONFIG, parts, [], 10.0)
    assert launched and result.status == Status.OOM
    assert result.cause == "on node b:2, local rank 1: OutOfMemoryError: emulated"


def test_a_lost_node_is_no_verdict_on_the_config() -> None:
    error = RankAccount(node="a:1", local_rank=0, rank=0, status=Status.ERROR, cause="gloo: connection reset")
    result, launched = merge_nodes(CONFIG, [part("a:1", error, ok("a:1", 1, 1))], ["b:2"], 10.0)
    assert launched and result.status == Status.KILLED and result.status.transient
    assert result.cause is not None and result.cause.startswith("node b:2 was lost during the probe")
    assert result.samples_per_s is None and [n.name for n in result.nodes] == ["a:1"]


def test_a_node_whose_ranks_never_started_is_a_launch_failure_naming_it() -> None:
    silent = part("b:2", RankAccount(node="b:2", local_rank=0), RankAccount(node="b:2", local_rank=1), said="timed out")
    result, launched = merge_nodes(CONFIG, [part("a:1", ok("a:1", 0, 0), ok("a:1", 1, 1)), silent], [], 10.0)
    assert not launched and result.status == Status.ERROR
    assert "node b:2: torchrun said: timed out" in (result.cause or "")


def test_nodes_that_differ_are_said() -> None:
    same = [ProbeNode(name="a", versions={"torch": "2.13"}), ProbeNode(name="b", versions={"torch": "2.13"})]
    assert differences(same) is None
    other = [same[0], ProbeNode(name="b", versions={"torch": "2.12"}, fingerprint={"gpu_name": "H100"})]
    said = differences(other) or ""
    assert said.startswith("nodes differ: ") and "torch 2.13 on a, 2.12 on b" in said and "gpu_name - on a" in said


def test_a_closed_connection_after_another_nodes_deadline_is_the_timeout() -> None:
    """Each node keeps its own clock: node a:1 killed its ranks at its deadline while b:2's still waited, and a rank of
    b:2 then failed on the closed connection (seen under load in test_node_parts). That is the timeout, not an
    error of the config; an error of its own (not a closed connection) still names the probe."""
    timed = RankAccount(node="a:1", local_rank=1, rank=1, status=Status.TIMEOUT, cause="killed at the deadline")
    closed = RankAccount(
        node="b:2", local_rank=0, rank=2, status=Status.ERROR,
        cause="DistNetworkError: Failed to recv, got 0 bytes. Connection was likely closed.",
    )  # fmt: skip
    a = NodePart(node="a:1", address="10.0.0.1", accounts=[timed, RankAccount(node="a:1", local_rank=0)], nproc=2)
    a = a.model_copy(update={"timed_out": True})
    result, _ = merge_nodes(CONFIG, [a, part("b:2", closed, RankAccount(node="b:2", local_rank=1))], [], 50.0)
    assert result.status == Status.TIMEOUT and "passed its" in (result.cause or ""), result.cause
    own = closed.model_copy(update={"cause": "ValueError: a bad value"})
    result, _ = merge_nodes(CONFIG, [a, part("b:2", own, RankAccount(node="b:2", local_rank=1))], [], 50.0)
    assert result.status == Status.ERROR and "ValueError" in (result.cause or "")
