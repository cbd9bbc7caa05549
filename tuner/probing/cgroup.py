"""Evidence of the kernel's OOM killer: the ``oom_kill`` counter of this process's memory cgroup.

A probe rank dead of SIGKILL is a host OOM only when the kernel says so: the counter of the cgroup the ranks run in
(cgroup v2 ``memory.events``, v1 ``memory.oom_control``) went up while the probe ran. Without a readable counter
(no cgroup memory controller, a foreign mount) a SIGKILL proves nothing: the rank is "killed", not "host-oom".
"""

from __future__ import annotations

from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def parse_oom_kills(text: str) -> int | None:
    """The ``oom_kill N`` line of a memory.events / memory.oom_control text; None when it has none."""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "oom_kill" and parts[1].isdigit():
            return int(parts[1])
    return None


def cgroup_paths(proc_cgroup: str, root: Path = CGROUP_ROOT) -> list[Path]:
    """Where this process's OOM-kill counter can be read, from the text of /proc/self/cgroup (v2 first, then v1; then
    the mount's own root, which is this process's cgroup inside a container's cgroup namespace)."""
    out: list[Path] = []
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        rel = path.lstrip("/")
        if controllers == "":  # cgroup v2: the unified hierarchy
            out.append(root / rel / "memory.events")
        elif "memory" in controllers.split(","):
            out.append(root / "memory" / rel / "memory.oom_control")
    for fallback in (root / "memory.events", root / "memory" / "memory.oom_control"):
        if fallback not in out:
            out.append(fallback)
    return out


def read_oom_kills() -> int | None:
    """This process's memory cgroup OOM-kill count now, or None where no counter is readable."""
    try:
        proc = Path("/proc/self/cgroup").read_text()
    except OSError:
        return None
    for path in cgroup_paths(proc):
        try:
            count = parse_oom_kills(path.read_text())
        except OSError:
            continue
        if count is not None:
            return count
    return None


def oom_kills_between(before: int | None, after: int | None) -> int | None:
    """How many OOM kills the cgroup saw between two reads (None when either read had no counter)."""
    if before is None or after is None:
        return None
    return max(0, after - before)
