"""One probe across two "nodes" on this host: two torchrun agents on one c10d endpoint (tuner.probing.local_nodes, the
parts a search across nodes runs, without the database), 2 x 2 gloo ranks of builtin:tiny-llama. One verdict over
every rank of both nodes, ranks keyed by (node, local rank), and no process of either node left once it returns:
after an OOM, after a rank killed on one node, after a rank that hangs (each node kills its own at the deadline; no
test waits on a gloo timeout)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from trials.contract import Knobs, ModelSpec, ProbeConfig, Status
from trials.node_rank import FORKSERVER_ENV, rank_file
from tuner.probing import forkserver
from tuner.probing.environment import probe_env
from tuner.probing.local_nodes import run_local_nodes

MODEL = ModelSpec(source="builtin:tiny-llama")


@pytest.fixture(scope="module")
def env() -> Iterator[dict[str, str]]:
    """The probe environment with this process's fork server (the node's ranks are forked from it, as a worker's)."""
    server = forkserver.get_server(probe_env(1))
    yield {**probe_env(2), FORKSERVER_ENV: str(server.path)}
    forkserver.shutdown()


def fsdp_config(
    micro: int,
    *,
    timeout_s: float = 240.0,
    device_memory: int | None = None,
    measure_steps: int = 4,
    **knobs: object,
) -> ProbeConfig:
    k = Knobs(micro_batch_size=micro, max_length=64, engine="fsdp2", **knobs)  # type: ignore[arg-type]
    accum = max(1, 16 // (4 * micro))
    return ProbeConfig(
        model=MODEL,
        knobs=k,
        world_size=4,
        nnodes=2,
        gradient_accumulation_steps=accum,
        timeout_s=timeout_s,
        device_memory=device_memory,
        measure_steps=measure_steps,
        max_measure_steps=measure_steps,
    )


def rank_pids(work: Path) -> list[int]:
    """The ranks' (and their torchrun wrappers') pids every node folder recorded."""
    import json

    out = []
    for path in work.glob("node*/lrank*.pid"):
        said = json.loads(path.read_text())
        out += [int(said["pid"]), int(said["wrapper"])]
    return out


def left_behind(work: Path) -> list[str]:
    """Processes of the probe still alive: its ranks and wrappers, and anything whose command line names its folders
    (the torchrun agents, spawned ranks)."""
    alive = []
    for pid in rank_pids(work):
        try:
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE:
                alive.append(f"{pid} {p.cmdline()[:4]}")
        except psutil.NoSuchProcess:
            continue
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if str(work) in cmd and p.info["pid"] != os.getpid():
            alive.append(f"{p.info['pid']} {cmd[:120]}")
    return alive


def when_rank_starts(work: Path, node: int, local: int, act: signal.Signals, after_s: float = 0.0) -> threading.Thread:
    """A thread that sends ``act`` to one rank of one node once it started (its pid file), ``after_s`` later."""

    def run() -> None:
        path = rank_file(work / f"node{node}", local, "pid")
        end = time.monotonic() + 300
        while not path.exists() and time.monotonic() < end:
            time.sleep(0.05)
        time.sleep(after_s)
        import json

        os.kill(int(json.loads(path.read_text())["pid"]), act)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.slow
def test_a_probe_across_two_agents_measures_every_rank_keyed_by_node(tmp_path, env) -> None:  # type: ignore[no-untyped-def]
    result = run_local_nodes(fsdp_config(2, dp_replicate_size=2), env, tmp_path)
    assert result.status == Status.OK, result.cause
    assert sorted(m.rank for m in result.ranks) == [0, 1, 2, 3]
    assert {n.name for n in result.nodes} == {"node0", "node1"}
    given = sorted(r for n in result.nodes for r in n.ranks.values())
    assert given == [0, 1, 2, 3] and all(sorted(n.ranks) == [0, 1] for n in result.nodes)  # (node, local rank) keys
    assert result.sharded is True and result.samples_per_s
    assert not left_behind(tmp_path)


@pytest.mark.slow
def test_an_oom_on_the_nodes_is_one_typed_verdict_and_leaves_no_process(tmp_path, env) -> None:  # type: ignore[no-untyped-def]
    result = run_local_nodes(fsdp_config(4, device_memory=2 * 2**20), env, tmp_path)
    assert result.status == Status.OOM, result.cause
    assert (result.cause or "").startswith("on node node")  # the rank named by its node and local rank
    assert not left_behind(tmp_path)


@pytest.mark.slow
def test_a_rank_killed_on_one_node_stops_both_nodes(tmp_path, env) -> None:  # type: ignore[no-untyped-def]
    killer = when_rank_starts(tmp_path, 1, 0, signal.SIGKILL, after_s=2.0)
    # a probe that measures for minutes: the kill lands mid-probe however fast this host runs the four steps
    result = run_local_nodes(fsdp_config(2, measure_steps=100_000), env, tmp_path)
    killer.join()
    assert result.status == Status.KILLED, result.cause  # an outside kill: no verdict on the config
    assert (result.cause or "").startswith("on node node1, local rank 0: ")
    assert not left_behind(tmp_path)


@pytest.mark.slow
def test_a_hanging_rank_is_killed_with_every_rank_of_both_nodes_at_the_deadline(tmp_path, env) -> None:  # type: ignore[no-untyped-def]
    freezer = when_rank_starts(tmp_path, 0, 1, signal.SIGSTOP)
    result = run_local_nodes(fsdp_config(2, timeout_s=45.0), env, tmp_path)
    freezer.join()
    # each node killed its own ranks at the probe's deadline (not at gloo's 30-minute default), the hung one's too
    assert result.status == Status.TIMEOUT and "passed its 45 s timeout" in (result.cause or ""), result.cause
    assert not left_behind(tmp_path)  # the stopped rank too: SIGKILL reaches a stopped process
