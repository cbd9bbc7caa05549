"""A rank's last word: why it ended, typed (trials.contract.RankReason), when it cannot say so in its result file.

A rank's result file is its own account (status, cause, memory) and the runner reads it first. These hooks, installed
for the whole of a rank's run (by ``python -m trials`` before its heavy imports, by ``trials.probe.run_probe_rank`` in
a fork server's child), cover what the rank's own handler cannot:

* SIGINT from outside (the runner never sends one; its ranks run in their own sessions): "killed" is written the
  moment it arrives, before the KeyboardInterrupt unwinds (a library may turn it into another error on its way out);
* an exception past the rank's handler (the interrupt; a failure while classifying a failure) is written down with its
  class (``trials.outcome.classify``), its traceback goes to stderr for a person, and the rank exits with the class's
  exit code (``trials.contract.Status.exit_code``) instead of a traceback's 1;
* a result file that cannot be written (a full disk, its path taken): the result's status and cause are written here;
* an exception on a side thread (``threading.excepthook``): written the moment it happens. The rank goes on; its result
  wins if it still writes one, and if it then dies or hangs until the runner kills it, this is why.

The first word stands: a later one does not overwrite it, and the exit code follows it. What no hook can catch (SIGKILL;
an abort or a segfault inside a C++/CUDA library: the NCCL watchdog, std::terminate on a library thread) leaves no
record; the runner then has the exit code and, only then, the rank's stderr (``tuner.probing.verdict.stderr_fallback``,
the documented exception). No torch import here until a failure is classified: it is installed before the imports.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from trials.contract import (
    EXIT_ERROR,
    Phase,
    ProbeConfig,
    RankReason,
    RankResult,
    Status,
    rank_out_path,
    reason_path,
)

Classifier = Callable[[BaseException], tuple[Status, int]]

_ACTIVE: LastWords | None = None  # the hooks installed in this process


def write_atomically(path: Path, text: str) -> None:
    """Writes ``text`` to ``path`` through a temporary file and a rename: the runner never reads half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _classify(exc: BaseException) -> tuple[Status, int]:
    from trials.outcome import classify

    return classify(exc)


class LastWords:
    """A rank's hooks (see the module doc) for its result file ``result_path`` and its record beside it
    (``trials.contract.reason_path``). A context manager around the rank's run, which ends by ``deliver``-ing its
    result; ``exit_code`` is the class's exit code of an exception it caught. Entered again in the same process (the
    rank's run inside ``python -m trials``), it is the same hooks: only the outermost ``with`` installs and decides."""

    def __init__(self, result_path: Path, rank: int) -> None:
        self.result_path = result_path
        self.path = reason_path(result_path)
        self.rank = rank
        self.exit_code = EXIT_ERROR
        self.spoken: RankReason | None = None
        self._phase: Callable[[], Phase | None] = lambda: None
        self._classify: Classifier = _classify
        self._lock = threading.RLock()  # the SIGINT handler runs on the main thread, maybe inside ``say``
        self._depth = 0
        self._previous_hook = threading.excepthook
        self._previous_sigint: Any = signal.default_int_handler
        self._sigint = False

    @classmethod
    def of_rank(cls, config: ProbeConfig, out: Path) -> LastWords:
        """The hooks of this process's rank (RANK / WORLD_SIZE from the runner; else rank 0 of the config's world) for
        its result path under ``out`` (``trials.contract.rank_out_path``): the ones installed already, if any."""
        rank = int(os.environ.get("RANK", "0"))
        path = rank_out_path(out, rank, int(os.environ.get("WORLD_SIZE", str(config.world_size))))
        if _ACTIVE is not None and _ACTIVE.result_path == path:
            return _ACTIVE
        return cls(path, rank)

    def attach(self, phase: Callable[[], Phase | None], classifier: Classifier) -> None:
        """The probe's phase and its classifier (which knows whether the rank is on CUDA), once the probe exists."""
        self._phase, self._classify = phase, classifier

    def say(self, status: Status, cause: str, source: str, *, fault: bool = False) -> RankReason | None:
        """Writes the record unless one was written already; None when it could not be written."""
        with self._lock:
            if self.spoken is not None:
                return self.spoken
            reason = RankReason.model_validate(
                {
                    "rank": self.rank,
                    "status": status,
                    "cause": cause[:1000],
                    "source": source,
                    "phase": self._phase(),
                    "launch_fault": fault,
                }
            )
            try:
                write_atomically(self.path, reason.model_dump_json())
            except OSError:
                return None  # nowhere to write: the exit code still carries the class
            self.spoken = reason
            return reason

    def exception(self, exc: BaseException, source: str) -> int:
        """Writes ``exc``'s class down (unless a word stands already); returns the exit code of what was said."""
        from trials.outcome import launch_fault, one_line

        status, code = self._classify(exc)
        said = self.say(status, one_line(exc), source, fault=launch_fault(exc))
        return (said.status.exit_code or EXIT_ERROR) if said is not None else code

    def deliver(self, result: RankResult, code: int) -> int:
        """Writes the rank's result file (atomically) and returns ``code``; when it cannot be written, its status and
        cause go to the record instead (an ok result that cannot be delivered is an error)."""
        try:
            write_atomically(self.result_path, result.model_dump_json(indent=1))
        except OSError as exc:
            from trials.outcome import one_line

            failed = result.status != Status.OK
            said = result.cause if failed and result.cause else f"the probe ended {result.status}"
            cause = f"{said}; its result file could not be written ({one_line(exc)})"
            self.say(result.status if failed else Status.ERROR, cause, "result-write", fault=result.launch_fault)
            return code if failed else EXIT_ERROR
        return code

    def _thread_hook(self, args: threading.ExceptHookArgs) -> None:
        self._previous_hook(args)  # the traceback on stderr, as without the hook
        exc = args.exc_value
        if exc is None or isinstance(exc, SystemExit):  # threading ignores SystemExit in a thread too
            return
        from trials.outcome import launch_fault, one_line

        status, _ = self._classify(exc)
        name = args.thread.name if args.thread is not None else "?"
        self.say(status, f"on thread {name}: {one_line(exc)}", "thread", fault=launch_fault(exc))

    def _interrupted(self, signum: int, frame: FrameType | None) -> None:
        self.say(
            Status.KILLED, "KeyboardInterrupt: interrupted by SIGINT from outside: no verdict on the config", "signal"
        )
        raise KeyboardInterrupt

    def __enter__(self) -> LastWords:
        global _ACTIVE
        self._depth += 1
        if self._depth == 1:
            self.path.unlink(missing_ok=True)
            _ACTIVE = self
            threading.excepthook = self._thread_hook
            if threading.current_thread() is threading.main_thread():
                self._previous_sigint = signal.signal(signal.SIGINT, self._interrupted)
                self._sigint = True
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> bool:
        global _ACTIVE
        self._depth -= 1
        if self._depth:
            return False  # the outer ``with`` decides
        _ACTIVE = None
        threading.excepthook = self._previous_hook
        if self._sigint:
            signal.signal(signal.SIGINT, self._previous_sigint or signal.SIG_DFL)
        if exc is None:
            return False
        traceback.print_exception(kind, exc, tb, file=sys.stderr)
        self.exit_code = self.exception(exc, "exception")
        return True  # the exit code carries it from here


__all__ = ["LastWords", "write_atomically"]
