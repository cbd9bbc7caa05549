"""Running the memory trace's subprocess (``python -m trials.estimate``; tuner/ never imports torch): the points
it is asked for, reported as they start to the command's progress reporter (tuner.trace_progress), its answer read
back as the Trace JSON."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trials.contract import TRACED_DECODE_STEPS
from tuner.errors import ConfigError, ModelSourceError
from tuner.memory import trace_cache
from tuner.trace_progress import TraceReporter, current

POLL_S = 0.25  # how often the progress file is read while the trace runs
MAX_WORKERS = 4  # tracer subprocesses side by side at most (each imports torch: ~0.5 GB)
STDERR_TAIL = 1 << 16  # the tracer's stderr read back (its last line says why it failed)


def point_label(p: Mapping[str, Any]) -> str:
    """A traced point in words: "micro 8 x 512 tokens, bf16, checkpointing" (FSDP2's: its ranks and knobs too)."""
    parts = [f"micro {p['micro_batch_size']} x {int(p['max_length']):,} tokens", str(p.get("precision", "fp32"))]
    if p.get("gradient_checkpointing"):
        parts.append("checkpointing")
    if "world_size" in p:  # an FSDP2 point
        parts.insert(0, f"FSDP2 on {p['world_size']} rank(s)")
        parts.append("reshard" if p.get("reshard_after_forward", True) else "no reshard")
        if p.get("offload_params"):
            parts.append("offload")
        if p.get("accumulates"):
            parts.append("accumulating")
    return ", ".join(parts)


def labels(request: Mapping[str, Any]) -> list[str]:
    """The request's points then its FSDP2 points, in words, in the order the subprocess traces them."""
    return [point_label(p) for p in [*(request.get("points") or []), *(request.get("fsdp_points") or [])]]


def what(request: Mapping[str, Any]) -> str:
    return f"tracing {(request.get('model') or {}).get('source', 'the model')}"


def run_cached(
    request: Mapping[str, Any], timeout_s: float, python: str | None, valid: trace_cache.Validate
) -> dict[str, Any]:
    """``run_request`` of the points the trace cache (tuner.memory.trace_cache) does not hold, merged with those it
    does (``valid`` checks each read back); the whole trace's JSON. Says on the reporter how many were cached."""
    cache = trace_cache.here() if trace_cache.same_python(python) else None
    if cache is None:
        return run_request(request, timeout_s, python)
    looked = trace_cache.look_up(cache, request, valid)
    reporter = current()
    if reporter is not None:
        reporter.cached(what(request), looked.hits, len(looked.keys), str(cache.dir))
    traced = run_request(looked.rest, timeout_s, python) if looked.rest is not None else None
    return trace_cache.merged(cache, request, looked, traced)


def run_request(request: Mapping[str, Any], timeout_s: float, python: str | None = None) -> dict[str, Any]:
    """The Trace JSON for ``request`` (tuner.memory.trace.trace builds it): its points split over up to
    ``workers()`` tracer subprocesses run side by side (a fake-tensor trace is one Python thread: a point per core),
    reported to the reporter in effect as they start, merged back in the request's order. Exit 3: the model's source
    is bad (ModelSourceError); 4: their arguments name what this host cannot run (ConfigError); a timeout is a
    ConfigError too."""
    reporter = current()
    started = time.monotonic()
    parts = split(request, workers())
    if reporter is not None:
        reporter.begin(what(request), labels(request), len(parts))
    ok = False
    try:
        with tempfile.TemporaryDirectory(prefix="tuner-trace-") as tmp:
            outs = _run_all(parts, Path(tmp), timeout_s, python, reporter)
            merged = _merge(request, parts, outs)
            merged["trace_s"] = time.monotonic() - started
            ok = True
            return merged
    finally:
        if reporter is not None:
            reporter.end(ok)


def workers() -> int:
    """How many tracer subprocesses run side by side: one per core, at most MAX_WORKERS."""
    return max(1, min(MAX_WORKERS, os.cpu_count() or 1))


#: a point's tracing time in units of its training steps' (a fake-tensor trace costs per dispatched op, whatever the
#: shapes): checkpointing's recomputed forward, the eval forward and each decoded token's step (trials.decode traces
#: at most TRACED_DECODE_STEPS of them). Measured on explain's points of flan-t5-large (bf16 cast module, micro 2, one
#: process):
#: 10 s the training steps, 13.0 / 12.9 s checkpointed at 320 / 640 tokens, 19.9 / 20.1 s with the eval forward and a
#: 24-token decode; dealt by tokens, one tracer got both checkpointed points and an eval point (46 s against 20 s)
CHECKPOINTED = 1.3
EVAL_FORWARD = 0.2
DECODE_STEP = 0.033


def _cost(p: Mapping[str, Any], request: Mapping[str, Any]) -> float:
    """A point's tracing time, roughly, in units of one uncheckpointed training step's: the number of ops traced
    (the shapes only break ties), an FSDP2 point's per rank."""
    cost = CHECKPOINTED if p.get("gradient_checkpointing") else 1.0
    evaluation = request.get("evaluation")
    if evaluation is not None and p.get("evaluate", True):
        cost += EVAL_FORWARD
        if evaluation.get("generate"):  # trials.trace_eval's decode length
            steps = int(evaluation.get("generation_max_length") or request.get("label_length") or p["max_length"])
            cost += DECODE_STEP * min(steps, TRACED_DECODE_STEPS)
    cost *= float(p.get("world_size", 1)) * (2.0 if p.get("accumulates") else 1.0)
    return cost + 1e-9 * float(p["micro_batch_size"]) * float(p["max_length"])


#: a part of a request: its sub-request and the request-wide index (points, then fsdp_points) of each of its points
Part = tuple[dict[str, Any], list[int]]


def split(request: Mapping[str, Any], count: int) -> list[Part]:
    """The request's points dealt to at most ``count`` sub-requests, the costliest first to the least loaded (each
    sub-request keeps everything else of the request); one sub-request when there is one point or none."""
    points, fsdp = list(request.get("points") or []), list(request.get("fsdp_points") or [])
    every = [("points", i, p) for i, p in enumerate(points)] + [("fsdp_points", i, p) for i, p in enumerate(fsdp)]
    count = max(1, min(count, len(every)))
    if count == 1:
        return [(dict(request), list(range(len(every))))]
    loads = [0.0] * count
    dealt: list[list[tuple[str, int, Mapping[str, Any]]]] = [[] for _ in range(count)]
    for kind, i, p in sorted(every, key=lambda e: -_cost(e[2], request)):
        w = loads.index(min(loads))
        loads[w] += _cost(p, request)
        dealt[w].append((kind, i, p))
    out: list[Part] = []
    for n, mine in enumerate(dealt):
        mine.sort(key=lambda e: (e[0] != "points", e[1]))  # as the request orders them
        sub = {
            **request,
            "points": [p for kind, _, p in mine if kind == "points"],
            "fsdp_points": [p for kind, _, p in mine if kind == "fsdp_points"],
            **({"model_wide": False} if n else {}),  # the model-wide numbers are read from the first part (_merge)
        }
        out.append((sub, [i if kind == "points" else len(points) + i for kind, i, _ in mine]))
    return out


def _merge(request: Mapping[str, Any], parts: list[Part], outs: list[dict[str, Any]]) -> dict[str, Any]:
    """The parts' answers as one: the model-wide numbers (the first part's: the others skip the job's optimizer
    state, ``split``), the points in order."""
    n = len(request.get("points") or [])
    slots: dict[int, dict[str, Any]] = {}
    for (_, where), got in zip(parts, outs, strict=True):
        for index, point in zip(where, [*got.get("points", []), *got.get("fsdp_points", [])], strict=True):
            slots[index] = point
    merged = {k: v for k, v in outs[0].items() if k not in ("points", "fsdp_points")}
    merged["points"] = [slots[i] for i in range(n)]
    merged["fsdp_points"] = [slots[i] for i in range(n, len(slots))]
    return merged


def _run_all(
    parts: list[Part], tmp: Path, timeout_s: float, python: str | None, reporter: TraceReporter | None
) -> list[dict[str, Any]]:
    """Runs a tracer per part side by side to their ends (all killed past ``timeout_s``, or when one fails or on
    Ctrl-C); their answers in order, or the first failure's error."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    deadline = time.monotonic() + timeout_s
    with contextlib.ExitStack() as stack:
        tracers = [
            stack.enter_context(_Tracer(sub, where, tmp / str(n), env, python)) for n, (sub, where) in enumerate(parts)
        ]
        while any(t.proc.poll() is None for t in tracers):
            if time.monotonic() > deadline:
                raise ConfigError(f"the memory trace took longer than {timeout_s:.0f} s; trace fewer points")
            if any(t.proc.poll() not in (None, 0) for t in tracers):
                break  # one failed: the others are stopped on the way out
            for t in tracers:
                t.tell(reporter)
            time.sleep(POLL_S)
        for t in tracers:
            t.tell(reporter)
        for t in tracers:  # a failure's error first (the others still running are stopped on the way out)
            if t.proc.poll() not in (None, 0):
                t.answer()
        return [t.answer() for t in tracers]


class _Tracer:
    """One ``python -m trials.estimate`` of a sub-request, its progress file and stderr; killed on the way out if
    it still runs."""

    def __init__(
        self, request: Mapping[str, Any], where: list[int], tmp: Path, env: dict[str, str], python: str | None
    ) -> None:
        tmp.mkdir(parents=True)
        self.where, self.out, self.said, self.seen = where, tmp / "trace.json", tmp / "progress", 0
        self.err = (tmp / "stderr").open("w+b")
        cmd = [python or sys.executable, "-m", "trials.estimate", "--request", json.dumps(request)]
        cmd += ["--out", str(self.out), "--progress", str(self.said)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self.err, env=env)

    def __enter__(self) -> _Tracer:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:  # Ctrl-C, a timeout or another tracer's failure: no tracer left behind
            self.proc.kill()
            self.proc.wait()
        self.err.close()

    def tell(self, reporter: TraceReporter | None) -> None:
        """Reports the points started since the last look (their request-wide index)."""
        if reporter is None or not self.said.exists():
            return
        lines = self.said.read_text().split("\n")[:-1]  # whole lines only: one being written waits for the next look
        for line in lines[self.seen :]:
            if line.strip().isdigit() and int(line) < len(self.where):
                reporter.point(self.where[int(line)])
        self.seen = len(lines)

    def answer(self) -> dict[str, Any]:
        """The tracer's Trace JSON, or the error its exit code and last stderr line say."""
        code = self.proc.wait()
        size = self.err.seek(0, os.SEEK_END)
        self.err.seek(max(0, size - STDERR_TAIL))
        last = (self.err.read().decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        if code == 3:
            raise ModelSourceError(last)
        if code == 4:  # their arguments name what this host cannot run: one line, as a probe refuses it
            raise ConfigError(last.removeprefix("refused: "))
        if code != 0 or not self.out.exists():
            raise RuntimeError(f"trials.estimate exited {code}: {last}")
        got: dict[str, Any] = json.loads(self.out.read_text())
        return got
