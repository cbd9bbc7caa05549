"""The tables a search across nodes keeps its workers in step through, on SQLite and a real PostgreSQL: one leader
per study (taken over only from a leader that stopped beating, by one worker), one part per node of a probe, the first
stop reason kept, the verdict kept with the closed probe; a worker waiting for its nodes names who is there and who
is gone."""

from __future__ import annotations

import pytest

from tuner.errors import NodeError
from tuner.session.nodes import Member, route_address
from tuner.storage import Store
from tuner.storage.nodes import NodeStore


@pytest.fixture
def nodes(storage_url: str) -> NodeStore:
    return NodeStore(Store(storage_url))


def test_one_leader_and_a_take_over_only_from_a_silent_one(nodes: NodeStore) -> None:
    for worker in ("a:1", "b:2", "c:3"):
        nodes.register("s", worker, "10.0.0.1", 2)
    assert nodes.lead("s", "a:1") and nodes.lead("s", "a:1")  # taken, then held
    assert not nodes.lead("s", "b:2")  # a live leader keeps it
    assert [n.worker for n in nodes.live_nodes("s")] == ["a:1", "b:2", "c:3"]
    # a leader silent for longer than the staleness allows: the first to see it takes the lease over; the next one
    # finds a live leader again
    assert nodes.lead("s", "b:2", stale_after=-1) and not nodes.lead("s", "c:3")
    assert nodes.lease("s").worker == "b:2"  # type: ignore[union-attr]
    nodes.end_lease("s", "b:2", "budget")
    assert not nodes.lead("s", "c:3", stale_after=-1)  # an ended search is led by nobody
    nodes.reopen_lease("s")  # a new search of the study
    assert nodes.lead("s", "c:3")


def test_a_probe_across_nodes_one_part_per_node_and_the_first_stop_reason(nodes: NodeStore) -> None:
    probe = nodes.post("s", "a:1", "10.0.0.1:29500", "r1", ["a:1", "b:2"], {"knobs": {}}, 30.0)
    assert [p.id for p in nodes.open_probes("s")] == [probe]
    assert nodes.join(probe, "b:2") and not nodes.join(probe, "b:2")
    nodes.stop(probe, "rank 3 of node b:2 failed")
    nodes.stop(probe, "node a:1 stopped beating")
    assert nodes.probe(probe).stop_reason == "rank 3 of node b:2 failed"
    nodes.report(probe, "b:2", {"node": "b:2"})
    assert [(p.worker, p.result) for p in nodes.parts(probe)] == [("b:2", {"node": "b:2"})]
    nodes.close(probe, {"status": "killed", "cause": "node b:2 was lost"})
    assert nodes.open_probes("s") == [] and nodes.probe(probe).result == {
        "status": "killed",
        "cause": "node b:2 was lost",
    }


def test_waiting_for_the_nodes_names_who_is_there_and_who_is_gone(storage_url: str) -> None:
    store = Store(storage_url)
    NodeStore(store).register("s", "b:2", "10.0.0.2", 2)
    NodeStore(store).leave("s", "b:2", "killed")
    member = Member(store, "s", "a:1", "10.0.0.1", nnodes=2, nproc=2, timeout_s=0.5, nodelist="gpu[1-2]")
    with member, pytest.raises(NodeError) as err:
        member.wait_for_nodes()
    line = str(err.value)
    assert "runs across 2 nodes; 1 of them beat" in line and "a:1 at 10.0.0.1" in line
    assert "gone: b:2 at 10.0.0.2, left: killed" in line and "gpu[1-2]" in line and "\n" not in line


def test_a_node_reaches_its_peers_from_the_address_it_reaches_the_storage_from() -> None:
    assert route_address("postgresql+psycopg://u@127.0.0.1:5432/db") == "127.0.0.1"
