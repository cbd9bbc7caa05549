"""The one status vocabulary: how a probe (or one of its ranks) ended, or why a trial has no probe, with each status's
exit code, severity, transience and listing place. Part of the probe contract: trials.contract re-exports it (tuner/
imports it from there). No torch import."""

from __future__ import annotations

from enum import Enum
from typing import Annotated

from pydantic import AfterValidator

# Exit codes of one probe rank (`python -m trials`); the result file holds the detail. Status.exit_code maps back.
EXIT_OK = 0
EXIT_OOM = 3
EXIT_ERROR = 4
EXIT_TIMEOUT = 5
EXIT_HOST_OOM = 6
EXIT_BUSY = 7
EXIT_KILLED = 8  # interrupted from outside (SIGINT: a KeyboardInterrupt): no verdict on the config
EXIT_REFUSED = 9  # the config cannot run here as it stands (said before its first step): no verdict on memory


class Status(str, Enum):
    """How a probe (or one of its ranks) ended, or why a trial has no probe: the one status vocabulary of the project
    (a rank's result, the runner's verdict, the probe rows, the Optuna trials' ``status`` attribute, every listing).
    Each member carries what the places that read statuses need: its exit code, its severity (which rank's failure
    names a multi-rank probe's), whether it is transient, where listings put it."""

    OK = "ok"
    OOM = "oom"  # the device ran out of memory (torch's OOM, a cuBLAS/NCCL allocation failure)
    TIMEOUT = "timeout"
    ERROR = "error"
    HOST_OOM = "host-oom"  # host memory did (the kernel's OOM killer, a failed pinned allocation): no device verdict
    DEVICE_BUSY = "device-busy"  # the rank found its GPU in use by another process at start: nothing measured
    # a rank died of SIGKILL without the kernel's OOM killer showing in its cgroup, or was interrupted (SIGINT) from
    # outside: no verdict, retried once
    KILLED = "killed"
    # the config cannot run on this host as it stands, said before any step with the reason (a DeepSpeed op that
    # could not be built, a setting the user's Trainer or DeepSpeed refuses): no memory verdict, not retried
    REFUSED = "refused"
    # never a rank's: a probe row ruled out without running (the frontier or the memory estimate says it must OOM)
    INFERRED_OOM = "inferred-oom"
    # never a probe's: an Optuna trial left unprobed (another worker had the config), or whose probe was interrupted
    SKIPPED = "skipped"
    INTERRUPTED = "interrupted"

    def __str__(self) -> str:
        return self.value

    @property
    def from_rank(self) -> bool:
        """A status a probe rank (and so a ProbeResult) can end with."""
        return self.exit_code is not None

    @property
    def exit_code(self) -> int | None:
        """The exit code of a rank that ended so (it carries the class even when the rank could write no file)."""
        return _EXIT_CODES.get(self)

    @property
    def severity(self) -> int:
        """Which rank's status names a multi-rank probe's (the highest): a memory failure is the root cause, then an
        outside kill (its peers then fail in a collective), then busy, error, timeout; ok lowest."""
        return _SEVERITY.get(self, 0)

    @property
    def transient(self) -> bool:
        """Nothing about the config was learned (the runner already retried it once): it may be probed again."""
        return self in (Status.DEVICE_BUSY, Status.KILLED)

    @property
    def out_of_memory(self) -> bool:
        """Measured or inferred: the config does not fit in *device* memory (a host OOM says nothing about that)."""
        return self in (Status.OOM, Status.INFERRED_OOM)

    @property
    def device_verdict(self) -> bool:
        """A measurement of device memory (fits or not): what the frontier and the memory estimate learn from."""
        return self in (Status.OK, Status.OOM)

    @property
    def listing_order(self) -> int:
        """Where `tuner trials` lists a probe of this status, after the stable ones (0): ok (unstable), the memory
        failures, timeouts, errors, the rest."""
        return _LISTING.get(self, 6)

    @classmethod
    def of_exit_code(cls, code: int) -> Status | None:
        """The status an exit code carries (EXIT_OK's too), or None for a code no rank exits with on purpose."""
        return next((s for s, c in _EXIT_CODES.items() if c == code), None)


_EXIT_CODES: dict[Status, int] = {
    Status.OK: EXIT_OK,
    Status.OOM: EXIT_OOM,
    Status.ERROR: EXIT_ERROR,
    Status.TIMEOUT: EXIT_TIMEOUT,
    Status.HOST_OOM: EXIT_HOST_OOM,
    Status.DEVICE_BUSY: EXIT_BUSY,
    Status.KILLED: EXIT_KILLED,
    Status.REFUSED: EXIT_REFUSED,
}
_SEVERITY: dict[Status, int] = {
    Status.OK: 0,
    Status.TIMEOUT: 1,
    Status.ERROR: 2,
    Status.REFUSED: 3,
    Status.DEVICE_BUSY: 4,
    Status.KILLED: 5,
    Status.HOST_OOM: 6,
    Status.OOM: 7,
}
_LISTING: dict[Status, int] = {
    Status.OK: 1,
    Status.OOM: 2,
    Status.HOST_OOM: 3,
    Status.TIMEOUT: 4,
    Status.ERROR: 5,
    Status.REFUSED: 6,
}
# each status's exit code, for the rank side (trials.last_words)
EXIT_CODES: dict[Status, int] = dict(_EXIT_CODES)


def _from_rank(status: Status) -> Status:
    """Pydantic check of a rank's or a probe's status: only what a rank can end with."""
    if not status.from_rank:
        raise ValueError(f"status {status.value!r} is not one a probe ends with")
    return status


#: a status field of a rank's or a probe's result (pydantic): only what a rank can end with
RankStatus = Annotated[Status, AfterValidator(_from_rank)]
