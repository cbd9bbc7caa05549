"""Two "nodes" on distinct addresses on this host: network namespaces joined by a bridge (iproute2, as root), the
tests' PostgreSQL (which listens on 127.0.0.1) relayed to the bridge's address by socat. ``nodes()`` yields them, or
raises NamespacesUnavailable saying why they could not be made (not root, no iproute2 or socat): the caller says so
and runs its 127.0.0.1 variant."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass


class NamespacesUnavailable(RuntimeError):
    pass


@dataclass(frozen=True)
class Node:
    namespace: str
    address: str
    interface: str  # the veth inside the namespace (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME)

    def command(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.namespace, *argv]


@dataclass(frozen=True)
class Nodes:
    nodes: tuple[Node, ...]
    relay_host: str  # where the namespaces reach the database
    relay_port: int


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        raise NamespacesUnavailable(f"`ip {' '.join(args)}` failed: {done.stderr.strip() or done.returncode}")


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def nodes(count: int, database: tuple[str, int]) -> Iterator[Nodes]:
    """``count`` namespaces on one bridge, each with its own address, and a relay to ``database`` (host, port)."""
    if os.geteuid() != 0:
        raise NamespacesUnavailable("not root: network namespaces need CAP_NET_ADMIN")
    for tool in ("ip", "socat"):
        if shutil.which(tool) is None:
            raise NamespacesUnavailable(f"{tool} is not installed")
    tag = f"{os.getpid() % 10000}{random.randrange(100)}"
    subnet = f"10.243.{random.randrange(1, 250)}"
    bridge = f"t43b{tag}"
    made: list[str] = []
    relay = None
    try:
        _ip("link", "add", bridge, "type", "bridge")
        _ip("addr", "add", f"{subnet}.1/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        out = []
        for i in range(count):
            ns, veth = f"t43n{tag}{i}", f"t43v{tag}{i}"
            _ip("netns", "add", ns)
            made.append(ns)
            _ip("link", "add", veth, "type", "veth", "peer", "name", f"{veth}p")
            _ip("link", "set", f"{veth}p", "master", bridge)
            _ip("link", "set", f"{veth}p", "up")
            _ip("link", "set", veth, "netns", ns)
            _ip("netns", "exec", ns, "ip", "addr", "add", f"{subnet}.{i + 2}/24", "dev", veth)
            _ip("netns", "exec", ns, "ip", "link", "set", veth, "up")
            _ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
            out.append(Node(ns, f"{subnet}.{i + 2}", veth))
        port = _free_port(f"{subnet}.1")
        relay = subprocess.Popen(
            ["socat", f"TCP-LISTEN:{port},bind={subnet}.1,fork,reuseaddr", f"TCP:{database[0]}:{database[1]}"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(0.5)
        yield Nodes(tuple(out), f"{subnet}.1", port)
    finally:
        if relay is not None:
            relay.kill()
            relay.wait()
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30, check=False)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True, timeout=30, check=False)
