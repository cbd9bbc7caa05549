"""Signs of life while the memory trace runs (issue 40 §2): a piped `tuner estimate` prints one line per stage on
stderr (what it traces, point i of n, the time elapsed) and nothing of it on stdout, which stays the table or the
JSON it was."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TUNER = [sys.executable, "-c", "from tuner.cli import main; main()"]
ESTIMATE = ["estimate", "--model", "builtin:tiny-t5", "--micro-batch-size", "8"]


def _run(cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TUNER_CACHE_DIR": str(cache)}
    return subprocess.run([*TUNER, *args], capture_output=True, text=True, env=env, timeout=600)


def test_a_piped_estimate_prints_its_stages_on_stderr_and_leaves_stdout_alone(tmp_path):
    done = _run(tmp_path / "cache", *ESTIMATE, "--json")
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)  # stdout is the JSON alone
    assert body["raw"] > 0
    stages = [line for line in done.stderr.splitlines() if line.startswith("tuner: tracing builtin:tiny-t5")]
    assert "2 point(s) on CPU fake tensors" in stages[0] and "starting the tracer (torch)" in stages[0], done.stderr
    shapes = {"micro 8 x 64 tokens, fp32", "micro 8 x 128 tokens, fp32"}  # in either order: tracers side by side
    assert any("point 1 of 2, " in s and "elapsed" in s and s.endswith(tuple(f"({x})" for x in shapes)) for s in stages)
    assert any("point 2 of 2, " in s and "elapsed" in s for s in stages), stages
    assert {x for x in shapes if any(s.endswith(f"({x})") for s in stages)} == shapes, stages
    assert stages[-1].startswith("tuner: tracing builtin:tiny-t5: done in "), stages
    assert "tracing" not in done.stdout and "\x1b" not in done.stderr  # piped: plain lines, no live display


def test_the_reporter_line_says_the_point_the_time_and_the_time_left():
    import io

    from tuner.trace_progress import TraceReporter

    out = io.StringIO()
    r = TraceReporter(out, live=False)
    r.begin("tracing m", ["micro 1 x 8 tokens, fp32", "micro 2 x 8 tokens, fp32", "micro 4 x 8 tokens, fp32"])
    r.point(0)
    r.point(1)
    r.end(True)
    r.begin("tracing m", ["micro 1 x 8 tokens, fp32", "micro 2 x 8 tokens, fp32", "micro 4 x 8 tokens, fp32"], 2)
    r.point(2)
    r.point(0)  # two tracers: both points started, none finished yet
    r.point(1)
    r.end(True)
    lines = out.getvalue().splitlines()
    assert lines[0] == "tuner: tracing m: 3 point(s) on CPU fake tensors; starting the tracer (torch)"
    assert lines[1].startswith("tuner: tracing m: point 1 of 3, ") and lines[1].endswith("(micro 1 x 8 tokens, fp32)")
    assert "about " in lines[2] and " left (micro 2 x 8 tokens, fp32)" in lines[2]
    assert lines[3].startswith("tuner: tracing m: done in ")
    assert (
        lines[4]
        == "tuner: tracing m: 3 point(s) on CPU fake tensors on 2 tracers side by side; starting the tracer (torch)"
    )
    assert lines[5].startswith("tuner: tracing m: point 1 of 3, ") and lines[5].endswith("(micro 4 x 8 tokens, fp32)")
    assert "left" not in lines[6] and "about " in lines[7] and lines[7].endswith("left (micro 2 x 8 tokens, fp32)")
