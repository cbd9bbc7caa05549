"""A probe across nodes whose nodes are all on this host: one torchrun agent per "node", each in its own folder, on
one c10d endpoint, in one process (a thread per node), with no database between them.

It runs exactly the parts a multi-node search runs (tuner.probing.agent.run_part) and merges them with the same
verdict (tuner.probing.node_verdict): the recorder (benchmarks/record.py --nnodes) and the tests use it to measure a
2 x 2 layout without two workers; a search across real nodes coordinates its parts through the study's database
(tuner.session.nodes).
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

from trials.contract import LAUNCH_ENV, ProbeConfig, ProbeResult, Status, allocator_env, free_port
from tuner.probing.accounts import NodePart
from tuner.probing.agent import NodeLaunch, run_part
from tuner.probing.node_verdict import merge_nodes
from tuner.settings import Settings


class SharedStop:
    """The Peers of parts in one process: the first reason announced stops them all."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reason: str | None = None

    def stop_reason(self) -> str | None:
        return self.reason

    def announce(self, reason: str) -> None:
        with self._lock:
            self.reason = self.reason or reason


def node_env(config: ProbeConfig, base: dict[str, str], extra: dict[str, str] | None = None) -> dict[str, str]:
    """What every node's agent (and so its ranks) inherits: the probe environment, the launch time, the allocator
    knob; the rendezvous variables (MASTER_ADDR, RANK ...) are torchrun's to set."""
    env = {k: v for k, v in base.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "LOCAL_WORLD_SIZE")}
    env[LAUNCH_ENV] = repr(time.time())
    env.update(allocator_env(config.knobs.alloc_conf))
    env.update(extra or {})
    return env


def run_local_nodes(
    config: ProbeConfig, env: dict[str, str], work: Path, address: str = "127.0.0.1", join_timeout_s: float = 60.0
) -> ProbeResult:
    """``config`` (its ``nnodes``) as that many nodes on this host, ``address`` for all of them."""
    endpoint = f"{address}:{free_port()}"
    rdzv = f"local-{uuid.uuid4().hex[:12]}"
    peers = SharedStop()
    parts: list[NodePart | None] = [None] * config.nnodes
    errors: list[str] = []
    start = time.monotonic()
    launched_env = node_env(config, env)

    def node(i: int) -> None:
        launch = NodeLaunch(f"node{i}", address, endpoint, rdzv, i == 0, join_timeout_s)
        try:
            parts[i] = run_part(config, launch, launched_env, work / f"node{i}", peers)
        except OSError as exc:
            errors.append(f"node{i}: {exc}")
            peers.announce(f"node{i} could not start torchrun")

    threads = [threading.Thread(target=node, args=(i,), name=f"tuner-node{i}") for i in range(config.nnodes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        return ProbeResult(status=Status.ERROR, cause=f"could not launch the probe: {'; '.join(errors)}")
    done = [p for p in parts if p is not None]
    return merge_nodes(config, done, [], time.monotonic() - start)[0]


def run_local_probe(config: ProbeConfig, settings: Settings | None = None) -> ProbeResult:
    """``config`` across its ``nnodes`` "nodes" on this host, as a search's workers run it: the probe environment of
    ``settings`` (None: read here), ranks forked from this process's preloaded fork server when the launcher setting
    allows, a temporary folder."""
    import shutil

    from trials.node_rank import FORKSERVER_ENV
    from tuner.probing import forkserver
    from tuner.probing.environment import probe_env
    from tuner.probing.runner import choose_launcher
    from tuner.probing.tempdirs import owned_dir
    from tuner.settings import load_settings

    settings = settings or load_settings()
    env = probe_env(config.nproc_per_node, settings=settings)
    if choose_launcher(None, settings) == "forkserver":
        env[FORKSERVER_ENV] = str(forkserver.get_server(probe_env(1, settings=settings)).path)
    work = owned_dir("tuner-node-")
    try:
        return run_local_nodes(config, env, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


__all__ = ["SharedStop", "node_env", "run_local_nodes", "run_local_probe"]
