"""`tuner prepare`: compiles the DeepSpeed ops probes load (cpu_adam; shm_comm without GPUs, fused_adam with them)
into the op cache, once per environment.

Optional — a search builds what a probe needs before that probe's clock starts — but run ahead of a search it keeps
the one-off compile (tens of seconds idle, minutes on a busy host) out of the search's budget.
"""

from __future__ import annotations

import time

import typer

from tuner.cli.app import app
from tuner.settings import load_settings


@app.command("prepare")
def prepare() -> None:
    """Compile the DeepSpeed ops the probes load into the op cache (once per Python environment)."""
    from tuner.probing.environment import probe_env
    from tuner.probing.gpus import has_visible_gpus
    from tuner.probing.ops import build_ops, missing_ops, prepare_ops

    env = probe_env(1)
    ops = prepare_ops(has_visible_gpus(env))
    ext_dir = load_settings().torch_extensions_dir
    start = time.monotonic()
    built = build_ops(ops, env)
    left = missing_ops(ops, ext_dir)
    if left:
        raise typer.Exit(_report_failed(left))
    what = ", ".join(built) if built else "nothing (all cached)"
    typer.echo(f"op cache {ext_dir}: built {what} in {time.monotonic() - start:.0f}s")


def _report_failed(ops: list[str]) -> int:
    from tuner.cli.app import err_console

    err_console.print(
        f"error: could not build DeepSpeed op(s) {', '.join(ops)}; run `python -m trials.ops "
        f"{' '.join(ops)}` to see the compiler's output (needs gcc, ninja and the Python headers)"
    )
    return 1
