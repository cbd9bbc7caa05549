"""Launches one probe (1..N ranks of ``python -m trials``), enforces its timeout, merges the rank results.

Every rank is launched directly by this runner with the torch.distributed env (RANK, LOCAL_RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT) — what torchrun does on one node — each in its own session (process group), so that:

* the runner sees every rank's own exit status: a rank killed by SIGKILL is told apart from a rank that failed or was
  stopped by us, without parsing any launcher's output; it is a host OOM ("host-oom") only when the memory cgroup's
  oom_kill counter rose during the probe (tuner.probing.cgroup), else "killed" (an outside kill: no verdict);
* at the timeout, or a few seconds after any rank fails (its peers may be blocked in a collective), every group is
  killed with SIGKILL: no hung survivors, children (op compiles) included.

Status comes from exit codes, the rank result files and the cgroup's OOM-kill counter; a rank dead without a result
is classified from its stderr too (an NCCL watchdog abort, a CUDA OOM on a side thread: ``trials.contract.
stderr_status``). A transient failure (a "killed" or "device-busy" rank, a launch or environment failure) is retried
once. On a GPU host each probe holds a lock per GPU it uses (one probe per GPU across this host's workers), and model
ids on the hub are resolved once per runner process: ranks read them offline. ``run_probe`` never raises for a probe's
failure.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from trials.contract import (
    BUILTIN_PREFIX,
    EXIT_BUSY,
    EXIT_HOST_OOM,
    EXIT_OK,
    EXIT_OOM,
    EXIT_TIMEOUT,
    FORKED_CUDA_BROKEN,
    LAUNCH_ENV,
    ModelSpec,
    ProbeConfig,
    ProbeResult,
    RankResult,
    Status,
    allocator_env,
    free_port,
    rank_out_path,
    stderr_status,
)
from tuner.errors import ConfigError
from tuner.probing import forkserver as launch_forkserver
from tuner.probing import gpus
from tuner.probing.cgroup import oom_kills_between, read_oom_kills
from tuner.probing.ops import ensure_ops
from tuner.settings import load_settings

FAILURE_GRACE_S = 5.0  # after a rank fails, how long its peers get to write their own result before the group kill
POLL_S = 0.05
LAUNCHERS = ("auto", "spawn", "forkserver")
STDERR_TAIL_LINES = 8
# which rank's status names the probe's: a memory failure is the root cause, then an outside kill (its peers then fail
# in a collective), a busy GPU, an error; a timeout names the probe only when nothing else does
_RANK: dict[str, int] = {"ok": 0, "timeout": 1, "error": 2, "device-busy": 3, "killed": 4, "host-oom": 5, "oom": 6}
TRANSIENT: frozenset[str] = frozenset({"killed", "device-busy"})  # no verdict on the config: retried once
MAX_ATTEMPTS = 2


def probe_env(world_size: int, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment every rank inherits: op caches, the venv's tools first on PATH, sane thread counts."""
    env = dict(os.environ if base is None else base)
    settings = load_settings()
    ext = settings.torch_extensions_dir
    ext.mkdir(parents=True, exist_ok=True)
    env["TORCH_EXTENSIONS_DIR"] = str(ext)
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = venv_bin + os.pathsep + env.get("PATH", "")
    if "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // world_size))
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    env.setdefault("NCCL_DEBUG", "WARN")  # a rank's stderr tail then carries NCCL's reason for a failure or hang
    return env


def hub_id(spec: ModelSpec) -> str | None:
    """The HF hub id a probe's ranks would look up on the network: None for a built-in preset or a local directory."""
    if spec.source.startswith(BUILTIN_PREFIX) or Path(spec.source).expanduser().is_dir():
        return None
    return spec.source


_RESOLVED: set[str] = set()


def resolve_hub_model(spec: ModelSpec) -> dict[str, str]:
    """Resolves a hub id once per runner process (its config into the HF cache); the environment that makes the ranks
    read it offline (HF_HUB_OFFLINE=1). Empty for built-in and local models. Raises OSError when it cannot resolve."""
    repo = hub_id(spec)
    if repo is None:
        return {}
    if repo not in _RESOLVED:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

        try:
            hf_hub_download(repo, "config.json")
        except (HfHubHTTPError, LocalEntryNotFoundError, ValueError) as exc:
            raise OSError(f"could not resolve model {repo!r} on the hub: {type(exc).__name__}: {exc}") from exc
        with contextlib.suppress(HfHubHTTPError, LocalEntryNotFoundError, ValueError):
            hf_hub_download(repo, "generation_config.json")  # optional
        _RESOLVED.add(repo)
    return {"HF_HUB_OFFLINE": "1"}


class _Proc(Protocol):
    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int | None: ...


@dataclass
class _Rank:
    rank: int
    proc: _Proc
    out: Path
    err: Path
    killed_by_us: bool = False
    result: RankResult | None = field(default=None)

    def read(self) -> RankResult | None:
        if self.result is None and self.out.exists():
            try:
                self.result = RankResult.model_validate_json(self.out.read_text())
            except ValueError:
                return None  # written atomically, so only a foreign file gets here
        return self.result


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def choose_launcher(launcher: str | None = None) -> str:
    """ "spawn" or "forkserver" from the argument or the TUNER_PROBE_LAUNCHER setting ("auto" decides per host)."""
    choice = (launcher or load_settings().probe_launcher).strip().lower()
    if choice not in LAUNCHERS:
        raise ConfigError(
            f"unknown probe launcher {choice!r}; use one of {', '.join(LAUNCHERS)} (TUNER_PROBE_LAUNCHER)"
        )
    if choice == "auto":
        return "forkserver" if launch_forkserver.usable() else "spawn"
    return choice


def _server(launcher: str, explicit: bool) -> launch_forkserver.ForkServer | None:
    if launcher != "forkserver":
        return None
    try:
        return launch_forkserver.get_server(probe_env(1))
    except OSError:
        if explicit:
            raise
        return None  # "auto": fall back to fresh interpreters


def _launch(
    config: ProbeConfig,
    work: Path,
    launch_t: float,
    server: launch_forkserver.ForkServer | None,
    extra_env: dict[str, str] | None = None,
) -> list[_Rank]:
    cfg_path = work / "probe.json"
    cfg_path.write_text(config.model_dump_json(indent=1))
    out = work / "result.json"
    world = config.world_size
    env = probe_env(world)
    env.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world)
    )
    env[LAUNCH_ENV] = repr(launch_t)
    env.update(allocator_env(config.knobs.alloc_conf))  # before any CUDA call of the rank
    env.update(extra_env or {})
    ranks: list[_Rank] = []
    try:
        for r in range(world):
            rank_env = dict(env, RANK=str(r), LOCAL_RANK=str(r))
            path = rank_out_path(out, r, world)
            path.unlink(missing_ok=True)
            so, se = work / f"rank{r}.stdout", work / f"rank{r}.stderr"
            proc: _Proc
            if server is not None:
                proc = server.spawn(
                    {
                        "config": str(cfg_path),
                        "out": str(out),
                        "env": rank_env,
                        "cwd": str(work),
                        "stdout": str(so),
                        "stderr": str(se),
                    }
                )
            else:
                with open(so, "wb") as fo, open(se, "wb") as fe:
                    proc = subprocess.Popen(
                        [sys.executable, "-m", "trials", "--config", str(cfg_path), "--out", str(out)],
                        env=rank_env,
                        stdout=fo,
                        stderr=fe,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                        cwd=str(work),
                    )
            pid_tmp = work / f"rank{r}.pid.tmp"
            pid_tmp.write_text(str(proc.pid))
            os.replace(pid_tmp, work / f"rank{r}.pid")  # the rank's pid is also its process group id
            ranks.append(_Rank(r, proc, path, se))
    except OSError:
        for launched in ranks:
            _kill_group(launched.proc.pid)
            launched.proc.wait()
        raise
    return ranks


def _supervise(ranks: Sequence[_Rank], deadline: float) -> bool:
    """Waits for every rank; kills all groups at the deadline or FAILURE_GRACE_S after a failure. True = timed out."""
    failed_at: float | None = None
    timed_out = False
    while True:
        running = [r for r in ranks if r.proc.poll() is None]
        if not running:
            break
        now = time.monotonic()
        if failed_at is None:
            for r in ranks:
                res = r.read()
                if (r.proc.returncode not in (None, EXIT_OK)) or (res is not None and res.status != "ok"):
                    failed_at = now
                    break
        if now >= deadline:
            timed_out = True
        if timed_out or (failed_at is not None and now - failed_at >= FAILURE_GRACE_S):
            for r in running:
                r.killed_by_us = True
                _kill_group(r.proc.pid)
            for r in running:
                r.proc.wait()
            break
        time.sleep(POLL_S)
    for r in ranks:  # stray children (compile jobs) of ranks that exited on their own
        _kill_group(r.proc.pid)
    return timed_out


def _tail(path: Path, lines: int = STDERR_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text[-lines:] if line.strip())


def exit_status(rank: int, code: int | None, stderr_tail: str, oom_kills: int | None) -> tuple[Status, str]:
    """(status, cause) of a rank that ended without a result file and was not stopped by us (pure).

    SIGKILL is a host OOM only with the kernel's word for it (``oom_kills``: the cgroup's OOM kills during the probe);
    otherwise "killed". Other deaths are read from the exit code, then the stderr tail (trials.contract.stderr_status:
    an NCCL watchdog abort, a CUDA OOM on a side thread)."""
    tail = f" [stderr: {stderr_tail}]" if stderr_tail else ""
    if code == -signal.SIGKILL:
        if oom_kills:
            return "host-oom", (
                f"rank {rank} was killed by the kernel's OOM killer (host out of memory: the memory cgroup counted "
                f"{oom_kills} OOM kill(s) during the probe)"
            )
        seen = "no OOM kill in the memory cgroup" if oom_kills == 0 else "no cgroup OOM counter to tell an OOM kill"
        return "killed", f"rank {rank} was killed by SIGKILL from outside ({seen}): no verdict on its memory"
    expected: dict[int | None, Status] = {
        EXIT_OOM: "oom",
        EXIT_TIMEOUT: "timeout",
        EXIT_HOST_OOM: "host-oom",
        EXIT_BUSY: "device-busy",
    }
    status: Status = expected.get(code) or stderr_status(stderr_tail) or "error"
    detail = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
    return status, f"rank {rank} ended with {detail} and no result file{tail}"


def _rank_status(r: _Rank, timed_out: bool, oom_kills: int | None) -> tuple[Status | None, str | None]:
    """(status, cause) of one rank; (None, None) for a rank we stopped because a peer failed first."""
    res = r.read()
    if res is not None:
        cause = res.cause
        if res.status == "error":
            tail = _tail(r.err)
            cause = f"{cause} [stderr: {tail}]" if tail and cause else (cause or tail or None)
        return res.status, cause
    if r.killed_by_us:
        return ("timeout", None) if timed_out else (None, None)
    return exit_status(r.rank, r.proc.returncode, _tail(r.err), oom_kills)


def merge(
    config: ProbeConfig, ranks: Sequence[_Rank], timed_out: bool, wall_s: float, oom_kills: int | None = None
) -> ProbeResult:
    statuses = [(r, *_rank_status(r, timed_out, oom_kills)) for r in ranks]
    results = [r.read() for r in ranks]
    memories = [res.memory for res in results if res is not None and res.memory is not None]
    first = next((res for res in results if res is not None), None)
    timed = [res for res in results if res is not None and res.setup_s is not None]
    slowest = max(timed, key=lambda res: res.setup_s or 0.0, default=None)
    failures = [(r, s, c) for r, s, c in statuses if s not in (None, "ok")]
    common = dict(
        ranks=memories,
        capacity=next((m.capacity for m in memories if m.capacity), None),
        versions=first.versions if first else {},
        fingerprint=first.fingerprint if first else {},
        wall_s=wall_s,
        setup_s=slowest.setup_s if slowest else None,
        setup_phases=slowest.setup_phases if slowest else {},
    )
    if timed_out and not any(s not in (None, "timeout") for _, s, _ in failures):
        return ProbeResult(
            status="timeout", cause=f"probe passed its {config.timeout_s:g} s timeout; all ranks were killed", **common
        )
    if failures:
        r, status, cause = max(failures, key=lambda f: (_RANK[f[1]], -f[0].rank))
        read = r.read()
        phase = read.phase if read is not None else None
        return ProbeResult(status=status, cause=cause or f"rank {r.rank}: {status}", phase=phase, **common)
    if any(s is None for _, s, _ in statuses) or results[0] is None or results[0].steps is None:
        return ProbeResult(status="error", cause="probe ended without results from every rank", **common)
    steps = results[0].steps
    samples = config.global_batch / steps.cycle_s if steps.cycle_s > 0 else None
    return ProbeResult(
        status="ok",
        samples_per_s=samples,
        tokens_per_s=samples * config.knobs.max_length if samples else None,
        steps=steps,
        **common,
    )


def is_transient(result: ProbeResult, launch_failed: bool) -> bool:
    """A failure that says nothing about the config (retried once): an outside kill, a busy GPU, a launch or
    environment failure (the fork server, the hub lookup, a forked rank that could not use CUDA)."""
    broken_fork = any(text in (result.cause or "").lower() for text in FORKED_CUDA_BROKEN)
    return launch_failed or result.status in TRANSIENT or broken_fork


def run_probe(config: ProbeConfig, workdir: Path | None = None, *, launcher: str | None = None) -> ProbeResult:
    """Runs one probe in its own process group(s) and returns its merged result; never raises for probe failures.

    ``workdir`` keeps the config, per-rank results, pids and stdout/stderr (a temporary directory, removed, when None).
    ``launcher``: "spawn" (a fresh ``python -m trials`` per rank), "forkserver" (ranks forked from a preloaded server)
    or "auto" (default: the TUNER_PROBE_LAUNCHER setting). DeepSpeed ops the config needs are compiled before the
    probe's clock starts. A transient failure (``is_transient``) is run once more; ``attempts`` says how many ran.
    """
    how = choose_launcher(launcher)
    explicit = (launcher or load_settings().probe_launcher) == "forkserver"
    ensure_ops(config, probe_env(config.world_size))
    own = workdir is None
    work = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="tuner-probe-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        for attempt in range(1, MAX_ATTEMPTS + 1):
            result, launch_failed = _attempt(config, work, how, explicit)
            result = result.model_copy(update={"attempts": attempt})
            if not is_transient(result, launch_failed) or attempt == MAX_ATTEMPTS:
                return result
            if how == "forkserver" and any(t in (result.cause or "").lower() for t in FORKED_CUDA_BROKEN):
                how = "spawn"  # the server's process had touched CUDA: fresh interpreters from here on
                launch_forkserver.disable()
        return result
    finally:
        if own:
            shutil.rmtree(work, ignore_errors=True)


def _attempt(config: ProbeConfig, work: Path, how: str, explicit: bool) -> tuple[ProbeResult, bool]:
    """One launch of the probe: (its result, whether it failed before any rank ran)."""
    try:  # started (once per runner process) before the probe's clock
        server = _server(how, explicit=explicit)
        hub_env = resolve_hub_model(config.model)
    except OSError as exc:
        return ProbeResult(status="error", cause=f"could not prepare the probe: {exc}"), True
    visible, physical, _ = gpus.host_visible_devices()
    names = gpus.lock_names(config.world_size, visible) if physical else []
    with gpus.gpu_locks(names, timeout_s=config.timeout_s) as free:
        if not free:
            cause = f"GPUs {', '.join(names)} stayed held by another probe on this host for {config.timeout_s:g} s"
            return ProbeResult(status="device-busy", cause=cause), False
        launch_t = time.time()
        start = time.monotonic()
        kills_before = read_oom_kills()
        try:
            ranks = _launch(config, work, launch_t, server, hub_env)
        except OSError as exc:
            return ProbeResult(status="error", cause=f"could not launch the probe: {exc}"), True
        timed_out = _supervise(ranks, start + config.timeout_s)
        kills = oom_kills_between(kills_before, read_oom_kills())
        return merge(config, ranks, timed_out, time.monotonic() - start, kills), False


__all__ = ["choose_launcher", "exit_status", "hub_id", "is_transient", "probe_env", "run_probe"]
