"""Searches across two "nodes" on this host: two `tuner search --nnodes 2 --nproc-per-node 2` workers on one PostgreSQL
study, each starting its own torchrun agent per probe on the leader's c10d endpoint (2 x 2 gloo ranks of
builtin:tiny-llama). A ZeRO-3 search and an FSDP2 HSDP search prune real OOMs and pick a stable config whose exports
name 2 machines; a node killed mid-probe is recorded by the other and the search goes on once it is back; the leader
killed, a follower takes the lead and the study resumes with every measurement kept; a node that never joins is a
typed failure naming it. No test leaves a process behind (every process a worker started carries the test's mark)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

TUNER = str(Path(sys.executable).with_name("tuner"))
MARK = "TUNER_TEST_NODES_MARK"
ZERO3_SPACE = """engine: [deepspeed]
zero_stage: [3]
micro_batch_size: [2, 8]
max_length: [64]
reduce_bucket_size: [500000]
overlap_comm: [false]
offload_optimizer: [false]
gradient_checkpointing: [false]
zero_hpz_partition_size: [null, 2]
"""
# HSDP: a replica per node, parameters sharded over its 2 ranks; 12 MiB per rank: micro 2 and 4 fit, 8 runs out
HSDP_SPACE = """engine: [fsdp2]
micro_batch_size: [2, 4, 8]
max_length: [128]
reshard_after_forward: [true]
offload_params: [false]
gradient_checkpointing: [false]
dp_replicate_size: [2]
"""


class Workers:
    """The `tuner search` workers of one test, each in its own session, every process they start marked."""

    def __init__(self, tmp: Path, url: str, study: str, args: list[str]) -> None:
        self.tmp, self.url, self.study, self.args = tmp, url, study, args
        self.mark = uuid.uuid4().hex
        self.procs: list[subprocess.Popen[str]] = []

    def start(
        self, *, prefix: list[str] | None = None, env: dict[str, str] | None = None, url: str | None = None
    ) -> subprocess.Popen[str]:
        """One more worker (``prefix``: run it inside, e.g. `ip netns exec NS`; ``url``: the storage as it reaches
        it)."""
        i = len(self.procs)
        full = {**os.environ, "COLUMNS": "200", MARK: self.mark, "TUNER_NODE_TIMEOUT_S": "40", **(env or {})}
        proc = subprocess.Popen(
            [*(prefix or []), TUNER, "search", "--study", self.study, "--storage", url or self.url, *self.args],
            stdout=open(self.tmp / f"w{i}.out", "w"),  # closed when the process ends
            stderr=open(self.tmp / f"w{i}.err", "w"),
            text=True,
            env=full,
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def log(self, proc: subprocess.Popen[str]) -> str:
        i = self.procs.index(proc)
        return (self.tmp / f"w{i}.out").read_text()[-3000:] + (self.tmp / f"w{i}.err").read_text()[-3000:]

    def worker(self, proc: subprocess.Popen[str]) -> str:
        return f"{os.uname().nodename}:{proc.pid}"

    def marked(self) -> list[str]:
        """Processes still alive that a worker of this test started (the mark in their environment)."""
        found = []
        for p in psutil.process_iter(["pid", "cmdline"]):
            try:
                if p.environ().get(MARK) == self.mark and p.status() != psutil.STATUS_ZOMBIE:
                    found.append(f"{p.pid} {' '.join(p.info['cmdline'] or [])[:120]}")
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return found

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture
def workers(tmp_path: Path, new_postgres_url: Callable[[], str]) -> Iterator[Callable[..., Workers]]:
    made: list[Workers] = []

    def make(study: str, space: str, *args: str) -> Workers:
        url = new_postgres_url()
        path = tmp_path / f"{study}.yaml"
        path.write_text(space)
        base = ["--nnodes", "2", "--nproc-per-node", "2", "--space", str(path), "--no-estimate", "--seed", "1"]
        base += ["--finalists", "1"]
        w = Workers(tmp_path, url, study, [*base, "--model", "builtin:tiny-llama", *args])
        made.append(w)
        return w

    yield make
    for w in made:
        w.kill_all()


def wait_for(what: Callable[[], object], timeout: float, why: str) -> object:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = what()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"waited {timeout:g} s for {why}")


def tuner(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([TUNER, *args], capture_output=True, text=True, timeout=120, env=env, check=False)


def measured(url: str, study: str) -> list[tuple[str, dict, dict | None, bool, str]]:
    from tuner.storage import Store

    return [
        (r.status, dict(r.knobs), r.result, r.stable, r.fidelity)
        for r in Store(url).probes(study)
        if r.fidelity != "inferred"
    ]


@pytest.mark.slow
@pytest.mark.postgres
def test_a_zero3_search_across_two_nodes_prunes_an_oom_and_exports_two_machines(workers, tmp_path) -> None:  # type: ignore[no-untyped-def]
    w = workers("z3", ZERO3_SPACE, "--budget", "150s", "--device-memory", "9MiB", "--global-batch", "32")
    first = w.start()
    time.sleep(2)
    second = w.start()
    for proc in (first, second):
        proc.wait(timeout=600)
        assert proc.returncode == 0, w.log(proc)
    rows = measured(w.url, "z3")
    assert any(s == "oom" and k["micro_batch_size"] == 8 for s, k, _, _, _ in rows), rows  # a real OOM, 2 x 2 ranks
    ok = [r for s, _, r, st, _ in rows if s == "ok" and st]
    assert ok and all(len(r["nodes"]) == 2 and len(r["ranks"]) == 4 for r in ok)  # every rank of both nodes
    assert all(sorted(v for n in r["nodes"] for v in n["ranks"].values()) == [0, 1, 2, 3] for r in ok)
    best = json.loads(tuner("best", "--storage", w.url, "--study", "z3").stdout)
    assert best["knobs"]["zero_stage"] == 3 and best["nnodes"] == 2 and best["world_size"] == 4

    from accelerate.commands.config.config_args import load_config_from_file

    out = tmp_path / "accelerate.yaml"
    done = tuner("best", "--storage", w.url, "--study", "z3", "--format", "accelerate", "-o", str(out))
    assert done.returncode == 0, done.stderr
    loaded = load_config_from_file(str(out))  # accelerate's own loader
    assert loaded.num_machines == 2 and loaded.num_processes == 4 and loaded.distributed_type == "DEEPSPEED"
    launch = tuner("best", "--storage", w.url, "--study", "z3", "--format", "launch").stdout
    assert "--nnodes 2 --nproc-per-node 2 --rdzv-backend c10d" in launch
    assert not w.marked()


@pytest.mark.slow
@pytest.mark.postgres
def test_an_hsdp_search_survives_a_lost_node_and_a_dead_leader(workers) -> None:  # type: ignore[no-untyped-def]
    from tuner.storage import Store
    from tuner.storage.nodes import NodeStore

    w = workers("hsdp", HSDP_SPACE, "--budget", "240s", "--device-memory", "12MiB", "--global-batch", "32")
    nodes = NodeStore(Store(w.url))
    first = w.start()
    time.sleep(2)
    second = w.start()
    lease = wait_for(lambda: nodes.lease("hsdp"), 120, "a leader")
    lead, follow = (first, second) if lease.worker == w.worker(first) else (second, first)  # type: ignore[attr-defined]

    # a node killed mid-probe (its worker only: its agent and ranks die with it): the leader records it, goes on
    def follower_in_a_probe() -> bool:
        return any(
            p.worker == w.worker(follow) and p.finished_at is None
            for row in nodes.open_probes("hsdp")
            for p in nodes.parts(row.id)
        )

    wait_for(follower_in_a_probe, 180, "the follower's part of a probe")
    time.sleep(6)  # its ranks are up
    follow.send_signal(signal.SIGKILL)
    follow.wait()
    back = w.start()  # the node is back

    def lost_recorded() -> bool:
        causes = [(r.result or {}).get("cause") or "" for r in _closed(nodes, "hsdp")]
        return any("was lost during the probe" in c and w.worker(follow) in c for c in causes)

    wait_for(lost_recorded, 180, "the leader's record of the lost node")

    # the leader killed once a measurement is stored: the follower takes the lead, a new worker joins, it resumes
    wait_for(lambda: len(measured(w.url, "hsdp")) >= 2, 300, "two stored probes")
    kept = measured(w.url, "hsdp")
    lead.send_signal(signal.SIGKILL)
    lead.wait()
    again = w.start()
    for proc in (back, again):
        proc.wait(timeout=600)
        assert proc.returncode == 0, w.log(proc)
    assert nodes.lease("hsdp").worker in (w.worker(back), w.worker(again))  # the lead moved off the dead leader
    rows = measured(w.url, "hsdp")
    assert all(row in rows for row in kept)  # no measurement lost
    counts = Counter((json.dumps(k, sort_keys=True), f) for s, k, _, _, f in rows if s in ("ok", "oom"))
    assert max(counts.values()) == 1, counts  # no verdict measured twice
    assert any(s == "oom" and k["micro_batch_size"] == 8 for s, k, _, _, _ in rows), rows
    ok = [(k, r) for s, k, r, st, _ in rows if s == "ok" and st]
    assert ok and all(k["dp_replicate_size"] == 2 and r["sharded"] and len(r["nodes"]) == 2 for k, r in ok)
    best = json.loads(tuner("best", "--storage", w.url, "--study", "hsdp").stdout)
    assert best["knobs"]["engine"] == "fsdp2" and best["accelerate"]["parallelism_config"] == {
        "parallelism_config_dp_replicate_size": 2,
        "parallelism_config_dp_shard_size": 2,
    }
    assert best["accelerate"]["num_machines"] == 2
    assert not w.marked()


def _closed(nodes, study: str) -> list:  # type: ignore[no-untyped-def,type-arg]
    """The study's probes across nodes, closed ones with the leader's verdict."""
    import sqlalchemy as sa

    from tuner.records.nodes import NodeProbeRow
    from tuner.storage.schema import node_probes

    with nodes.engine.connect() as conn:
        rows = conn.execute(sa.select(node_probes).where(node_probes.c.study_name == study)).all()
    return [NodeProbeRow.from_record(dict(r._mapping)) for r in rows if r.closed_at is not None]


@pytest.mark.slow
@pytest.mark.postgres
def test_a_node_that_never_joins_is_a_typed_failure_naming_it(workers) -> None:  # type: ignore[no-untyped-def]
    from tuner.storage import Store
    from tuner.storage.nodes import NodeStore

    w = workers("never", HSDP_SPACE, "--budget", "120s", "--device-memory", "12MiB", "--global-batch", "32")
    nodes = NodeStore(Store(w.url))
    first = w.start()
    second = w.start()
    wait_for(lambda: len(nodes.nodes("never")) == 2, 120, "both workers registered")
    lease = wait_for(lambda: nodes.lease("never"), 60, "a leader")
    lead, frozen = (first, second) if lease.worker == w.worker(first) else (second, first)  # type: ignore[attr-defined]
    os.killpg(frozen.pid, signal.SIGSTOP)  # alive but silent: it beats no more and joins nothing
    try:
        lead.wait(timeout=300)
    finally:
        os.killpg(frozen.pid, signal.SIGKILL)
        frozen.wait()
    err = (w.tmp / f"w{w.procs.index(lead)}.err").read_text().strip().splitlines()
    assert lead.returncode == 2 and len(err) == 1, w.log(lead)
    assert w.worker(frozen) in err[0] and "runs across 2 nodes" in err[0] and "srun -N 2" in err[0]
    assert not w.marked()


@pytest.mark.slow
@pytest.mark.postgres
def test_two_nodes_on_distinct_addresses_in_network_namespaces(workers) -> None:  # type: ignore[no-untyped-def]
    """The same workers, each in a network namespace of its own with its own address (a bridge between them, the
    database relayed to it): each node's ranks rendezvous with the leader's address, gloo on the namespace's link.
    Where the namespaces cannot be made, this says why and runs both nodes on 127.0.0.1."""
    import warnings

    from sqlalchemy.engine import make_url

    from tests.helpers import netns
    from tuner.storage import Store
    from tuner.storage.nodes import NodeStore

    w = workers("netns", HSDP_SPACE.replace("[2, 4, 8]", "[2]"), "--budget", "90s", "--device-memory", "12MiB")
    w.args += ["--global-batch", "32", "--finalists", "0", "--n-trials", "1"]
    url = make_url(w.url)
    try:
        with netns.nodes(2, (url.host or "127.0.0.1", url.port or 5432)) as made:
            reach = url.set(host=made.relay_host, port=made.relay_port).render_as_string(hide_password=False)
            procs = [
                w.start(prefix=node.command([]), env={"GLOO_SOCKET_IFNAME": node.interface}, url=reach)
                for node in made.nodes
            ]
            for proc in procs:
                proc.wait(timeout=600)
                assert proc.returncode == 0, w.log(proc)
            addresses = {node.address for node in made.nodes}
    except netns.NamespacesUnavailable as why:
        warnings.warn(f"network namespaces unavailable ({why}): ran both nodes on 127.0.0.1", stacklevel=1)
        procs = [w.start(), w.start()]
        for proc in procs:
            proc.wait(timeout=600)
            assert proc.returncode == 0, w.log(proc)
        addresses = {"127.0.0.1"}
    store = Store(w.url)
    assert {n.address for n in NodeStore(store).nodes("netns")} == addresses
    (row,) = [r for r in store.probes("netns") if r.fidelity != "inferred"]
    assert row.status == "ok" and row.result is not None
    assert {n["address"] for n in row.result["nodes"]} == addresses and len(row.result["ranks"]) == 4
    assert not w.marked()
