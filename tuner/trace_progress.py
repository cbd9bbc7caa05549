"""Signs of life while the memory trace runs (`tuner estimate`, `tuner explain`, `tuner doctor --model`): what is
traced, which point of how many, the time elapsed and an estimate of the time left.

On a terminal one live line on stderr (rich, transient); piped or logged, one plain line per stage on stderr. Never
stdout: that may be the command's JSON. A command turns it on around its traces (``shown``); tuner.memory.trace_run
reports to the reporter in effect (``current``), and without one (the search, the Python API) nothing is printed.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TextIO

from rich.console import Console
from rich.live import Live
from rich.text import Text

from tuner.units import format_duration


class TraceReporter:
    """Follows one trace at a time: ``begin`` (what, the points to trace, how many came from the cache), ``point``
    (the index of the point starting), ``end``. Plain lines on ``stream``; a live line on a terminal."""

    def __init__(self, stream: TextIO | None = None, live: bool | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.console = Console(file=self.stream, highlight=False, soft_wrap=True)
        self.tty = self.console.is_terminal if live is None else live
        self.what = ""
        self.points: Sequence[str] = ()
        self.index: int | None = None  # the point started last
        self.count = 0  # the points started
        self.workers = 1
        self.started = 0.0
        self.first = 0.0  # when the first point started (after torch's import): the pace is measured from here
        self.live: Live | None = None

    # -- what tuner.memory.trace_run calls ---------------------------------------------------------------------------
    def cached(self, what: str, hits: int, total: int, where: str) -> None:
        """``hits`` of ``total`` points read from the trace cache at ``where``."""
        if hits:
            self._say(f"{what}: {hits} of {total} point(s) cached ({where})")

    def begin(self, what: str, points: Sequence[str], workers: int = 1) -> None:
        """A trace of ``points`` (in words) starts on ``workers`` tracers side by side; ``what``: "tracing <model>"."""
        self.what, self.points, self.index, self.workers, self.count = what, points, None, max(1, workers), 0
        self.started = self.first = time.monotonic()
        n = len(points)
        if self.tty:
            self.live = Live(self, console=self.console, refresh_per_second=2, transient=True)
            self.live.start()
        else:
            side = f" on {self.workers} tracers side by side" if self.workers > 1 else ""
            self._say(f"{what}: {n} point(s) on CPU fake tensors{side}; starting the tracer (torch)")

    def point(self, index: int) -> None:
        """The point of that index (in ``points``) starts."""
        if self.index is None:
            self.first = time.monotonic()
        self.index, self.count = index, self.count + 1
        if not self.tty:
            self._say(self.line())

    def end(self, ok: bool) -> None:
        took = format_duration(time.monotonic() - self.started)
        if self.live is not None:
            self.live.stop()
            self.live = None
        if not self.tty:
            self._say(f"{self.what}: done in {took}" if ok else f"{self.what}: stopped after {took}")

    # -- rendering ---------------------------------------------------------------------------------------------------
    def line(self) -> str:
        """``what``: point i of n, the time elapsed and, after the first point, the time left, then the point's shape
        (last: a narrow terminal crops it first)."""
        elapsed = time.monotonic() - self.started
        n = len(self.points)
        if self.index is None:
            return f"{self.what}: starting the tracer (torch), {format_duration(elapsed)} elapsed"
        label = self.points[min(self.index, n - 1)]
        done = max(0, self.count - self.workers)  # the points finished, about: those started less one a tracer
        left = ""
        if done:  # the pace of the points finished (after torch's import)
            left = f", about {format_duration((time.monotonic() - self.first) / done * (n - done))} left"
        return f"{self.what}: point {min(self.count, n)} of {n}, {format_duration(elapsed)} elapsed{left} ({label})"

    def __rich__(self) -> Text:
        return Text(self.line(), style="dim")

    def _say(self, line: str) -> None:
        if self.tty:
            self.console.print(Text(line, style="dim"))
        else:
            print(f"tuner: {line}", file=self.stream, flush=True)


_CURRENT: ContextVar[TraceReporter | None] = ContextVar("tuner_trace_reporter", default=None)


def current() -> TraceReporter | None:
    """The reporter a command turned on, None: trace silently."""
    return _CURRENT.get()


@contextmanager
def shown(reporter: TraceReporter | None = None) -> Iterator[TraceReporter]:
    """Reports every trace made inside (a new stderr reporter unless one is given)."""
    made = reporter if reporter is not None else TraceReporter()
    token = _CURRENT.set(made)
    try:
        yield made
    finally:
        _CURRENT.reset(token)


__all__ = ["TraceReporter", "current", "shown"]
