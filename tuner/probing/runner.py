"""Runs one probe: its ranks (tuner.probing.ranks: launched by the runner itself, each in its own process group,
killed as groups at the timeout or after a failure), one more run of a transient failure, and the verdict from the
ranks' own accounts (tuner.probing.verdict: result files, reason records, exit codes, the cgroup's OOM-kill counter).

``ProbeRunner`` is built once, at the edge, with the Settings (tuner.settings): the launcher and the op cache are read
there, never per probe. A probe's DeepSpeed ops are compiled before its clock starts (tuner.probing.ops); on a GPU host
it holds a lock per GPU it uses (one probe per GPU across this host's workers, tuner.probing.gpus); model ids on the
hub are resolved once per runner process (its ranks read them offline). A transient failure (a "killed" or
"device-busy" rank, a launch or environment failure) runs once more. A probe's failure never raises.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from trials.contract import ProbeConfig, ProbeResult, Status
from tuner.errors import ConfigError
from tuner.probing import forkserver as launch_forkserver
from tuner.probing import gpus, ranks, snapshots, verdict
from tuner.probing.cgroup import oom_kills_between, read_oom_kills
from tuner.probing.environment import probe_env, resolve_hub_model
from tuner.probing.ops import ensure_ops
from tuner.probing.ops import refusal as ops_refusal
from tuner.probing.tempdirs import owned_dir, sweep_once
from tuner.records.probe import EARLIER_REFUSAL
from tuner.settings import Settings, load_settings

LAUNCHERS = ("auto", "spawn", "forkserver")
MAX_ATTEMPTS = 2
# a rank's cause that refuses the engine for the model, whatever the knobs (trials.fsdp.FsdpRefusal): the runner says it
# once, and refuses that engine's next configs of the model without launching them
ENGINE_REFUSALS = ("FsdpRefusal:",)


def engine_key(config: ProbeConfig) -> str:
    """What an engine refusal holds for: the engine and the model (its source and overrides)."""
    return f"{config.knobs.engine} {config.model.model_dump_json(exclude={'vocab_size'})}"


def choose_launcher(launcher: str | None, settings: Settings) -> str:
    """ "spawn" or "forkserver" from the argument or the probe_launcher setting ("auto" decides per host, per probe:
    the fork server may have been turned off since)."""
    choice = (launcher or settings.probe_launcher).strip().lower()
    if choice not in LAUNCHERS:
        raise ConfigError(
            f"unknown probe launcher {choice!r}; use one of {', '.join(LAUNCHERS)} (TUNER_PROBE_LAUNCHER)"
        )
    if choice == "auto":
        return "forkserver" if launch_forkserver.usable() else "spawn"
    return choice


@dataclass(frozen=True)
class _Attempt:
    result: ProbeResult
    not_launched: bool = False  # it failed before any rank ran: the fork server, the hub lookup, the launch itself
    rank_fault: bool = False  # a rank said the launch was at fault (forked from a process that had initialised CUDA)

    @property
    def transient(self) -> bool:
        return verdict.is_transient(self.result.status, self.not_launched or self.rank_fault)


class ProbeRunner:
    """Runs probes with the settings it was built with: ``runner(config)`` returns the probe's merged ProbeResult.

    ``launcher``: "spawn" (a fresh ``python -m trials`` per rank), "forkserver" (ranks forked from a preloaded server)
    or "auto"; None: the settings' probe_launcher. An unknown one is a ConfigError here, before any probe."""

    def __init__(self, settings: Settings, launcher: str | None = None) -> None:
        self.settings = settings
        self.launcher = launcher
        self.explicit = (launcher or settings.probe_launcher) == "forkserver"
        choose_launcher(launcher, settings)  # refuses an unknown launcher now
        sweep_once()  # what a killed run (kill -9) left in the temp dir
        self.engine_refused: dict[str, str] = {}  # engine_key -> the refusal its first probe said

    def env(self, world_size: int) -> dict[str, str]:
        return probe_env(world_size, settings=self.settings)

    def __call__(self, config: ProbeConfig, workdir: Path | None = None) -> ProbeResult:
        """Runs ``config`` in its own process group(s); never raises for a probe's failure. ``workdir`` keeps the
        config, per-rank results, pids and stdout/stderr (a temporary directory, removed, when None); ``attempts``
        says how many launches it took."""
        how = choose_launcher(self.launcher, self.settings)
        refused = ops_refusal(ensure_ops(config, self.env(config.world_size)))
        if refused is not None:  # its ranks would compile inside the probe's clock, or fail at their first step
            return ProbeResult(status=Status.REFUSED, cause=refused)
        said = self.engine_refused.get(engine_key(config))
        if said is not None:
            return ProbeResult(status=Status.REFUSED, cause=f"{said}{EARLIER_REFUSAL}")
        own = workdir is None
        work = Path(workdir) if workdir is not None else owned_dir("tuner-probe-")
        work.mkdir(parents=True, exist_ok=True)
        try:
            for attempt in range(1, MAX_ATTEMPTS + 1):
                tried = self._attempt(config, work, how)
                result = tried.result.model_copy(update={"attempts": attempt})
                result = snapshots.keep(result, snapshots.snapshot_dir(self.settings.storage, self.settings.cache_dir))
                if not tried.transient or attempt == MAX_ATTEMPTS:
                    self._remember(config, result)
                    return result
                if how == "forkserver" and tried.rank_fault:
                    how = "spawn"  # the server's process had touched CUDA: fresh interpreters from here on
                    launch_forkserver.disable()
            return result
        finally:
            if own:
                shutil.rmtree(work, ignore_errors=True)

    def _remember(self, config: ProbeConfig, result: ProbeResult) -> None:
        cause = result.cause or ""
        if result.status == Status.REFUSED and cause.startswith(ENGINE_REFUSALS):
            self.engine_refused[engine_key(config)] = cause

    def _server(self, how: str) -> launch_forkserver.ForkServer | None:
        if how != "forkserver":
            return None
        try:
            return launch_forkserver.get_server(self.env(1))
        except OSError:
            if self.explicit:
                raise
            launch_forkserver.disable()  # "auto": fresh interpreters for the rest of the search, no restart per probe
            return None

    def _attempt(self, config: ProbeConfig, work: Path, how: str) -> _Attempt:
        """One launch of the probe."""
        try:  # started (once per runner process) before the probe's clock
            server = self._server(how)
            hub_env = resolve_hub_model(config.model)
        except OSError as exc:
            return _Attempt(
                ProbeResult(status=Status.ERROR, cause=f"could not prepare the probe: {exc}"), not_launched=True
            )
        visible, physical, _ = gpus.host_visible_devices()
        names = gpus.lock_names(config.world_size, visible, gpus.gpu_uuid) if physical else []
        with gpus.gpu_locks(names, timeout_s=config.timeout_s) as free:
            if not free:
                cause = f"GPUs {', '.join(names)} stayed held by another probe on this host for {config.timeout_s:g} s"
                return _Attempt(ProbeResult(status=Status.DEVICE_BUSY, cause=cause))
            launch_t = time.time()
            start = time.monotonic()
            kills_before = read_oom_kills()
            env = ranks.rank_env(config, self.env(config.world_size), launch_t, hub_env)
            try:
                started = ranks.launch(config, work, env, server)
            except OSError as exc:
                return _Attempt(ProbeResult(status=Status.ERROR, cause=f"could not launch the probe: {exc}"), True)
            timed_out = ranks.supervise(started, start + config.timeout_s)
            kills = oom_kills_between(kills_before, read_oom_kills())
            result = verdict.merge(config, started, timed_out, time.monotonic() - start, kills)
            return _Attempt(result, rank_fault=verdict.launch_fault(started))


def run_probe(
    config: ProbeConfig,
    workdir: Path | None = None,
    *,
    launcher: str | None = None,
    settings: Settings | None = None,
) -> ProbeResult:
    """One probe with a ProbeRunner built for it (see ProbeRunner). ``settings`` None: read here, at this outer edge;
    a caller running many probes builds one ProbeRunner with its Settings instead."""
    return ProbeRunner(settings or load_settings(), launcher)(config, workdir)


__all__ = ["LAUNCHERS", "ProbeRunner", "choose_launcher", "probe_env", "run_probe"]
