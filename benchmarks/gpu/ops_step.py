"""The GPU check's op builds: each DeepSpeed op the probes load built at once beside the others (``python -m trials.ops
--verbose OP`` in the probes' own environment: tuner.probing.environment.probe_env, the arch list DeepSpeed parses),
each under the step's box; one line per op, and every build's whole output (each compile command and the compiler's
words) in the log.

    python3 -m benchmarks.gpu.ops_step LOG BOX_S [--fail]

``--fail`` (the dry run's forced op-build failure): a C++ compiler that refuses every source, into a scratch op
cache, so the failure is a real build's (DeepSpeed's builder, torch's JIT, ninja); the probes' cache is untouched.
Exit 1 when an op failed or ran out of its box."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tuner.probing.environment import probe_env
from tuner.probing.gpus import has_visible_gpus
from tuner.probing.ops import prepare_ops

FAILING_CXX = """#!/bin/sh
for a in "$@"; do [ "$a" = "--version" ] && exec c++ "$@"; done
echo "fatal error: Python.h: No such file or directory (the GPU check's forced op-build failure)" >&2
exit 1
"""


def forced_failure(env: dict[str, str], scratch: Path) -> None:
    """The probes' environment with a compiler that refuses every source and a scratch op cache."""
    cxx = scratch / "bin" / "c++"
    cxx.parent.mkdir(parents=True, exist_ok=True)
    cxx.write_text(FAILING_CXX)
    cxx.chmod(0o755)
    env["CXX"] = str(cxx)
    env["TORCH_EXTENSIONS_DIR"] = str(scratch / "torch_extensions")


def said(op: str, stdout: str, rc: int | None, seconds: float, box_s: float) -> tuple[bool, str]:
    """Whether the op is usable, and its line (its build's JSON line: the last one of its stdout)."""
    if rc is None:
        return False, f"op {op}: FAIL killed at its {box_s:.0f} s box"
    found: dict[str, object] = {}
    for line in reversed(stdout.splitlines()):
        try:
            found = json.loads(line)
            break
        except ValueError:
            continue
    outcome = str(found.get("outcome", "failed"))
    reason = str(found.get("reason") or f"exited {rc} without a word")
    took = found.get("seconds")
    seconds = float(took) if isinstance(took, (int, float)) else seconds  # the build's own, not the batch's wall
    if outcome == "built":
        return True, f"op {op}: built (or found cached) in {seconds:.1f} s"
    if outcome == "not-needed":
        return True, f"op {op}: not needed ({reason})"
    return False, f"op {op}: FAIL in {seconds:.1f} s: {reason}"


def main(argv: list[str]) -> int:
    log, box_s, fail = Path(argv[0]), float(argv[1]), "--fail" in argv
    env = probe_env(1)
    if fail:
        forced_failure(env, log.parent / "forced-op-failure")
    ops = prepare_ops(has_visible_gpus(env))
    start = time.monotonic()
    procs = {
        op: subprocess.Popen(
            [sys.executable, "-m", "trials.ops", "--verbose", op],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        for op in ops
    }
    ok, sections = True, []
    for op, proc in procs.items():
        try:
            out, _ = proc.communicate(timeout=max(0.0, start + box_s - time.monotonic()))
            rc: int | None = proc.returncode
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            rc = None
        usable, line = said(op, out, rc, time.monotonic() - start, box_s)
        ok = ok and usable
        print(line, flush=True)
        sections.append(f"== {line}\n{out}")
    arch = env.get("TORCH_CUDA_ARCH_LIST", "unset")
    head = f"op cache {env['TORCH_EXTENSIONS_DIR']} | TORCH_CUDA_ARCH_LIST for the builds: {arch}\n"
    log.write_text(head + "\n".join(sections))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
