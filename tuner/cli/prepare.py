"""`tuner prepare`: compiles the DeepSpeed ops probes load (cpu_adam, shm comm) into the op cache, once per environment.

Optional — a search builds what a probe needs before that probe's clock starts — but run ahead of a search it keeps
the one-off compile (tens of seconds idle, minutes on a busy host) out of the search's budget.
"""

from __future__ import annotations

import time

import typer

from trials.contract import Knobs
from tuner.cli.app import app
from tuner.probing.config import probe_config
from tuner.settings import load_settings


@app.command("prepare")
def prepare() -> None:
    """Compile the DeepSpeed ops the probes load into the op cache (once per Python environment)."""
    from tuner.probing import forkserver as launch_forkserver
    from tuner.probing.environment import probe_env
    from tuner.probing.ops import ensure_ops, missing_ops, needed_ops

    config = probe_config(knobs=Knobs(micro_batch_size=1, max_length=8, zero_stage=1, offload_optimizer=True))
    ext_dir = load_settings().torch_extensions_dir
    start = time.monotonic()
    built = ensure_ops(config, probe_env(1))
    left = missing_ops(needed_ops(config, not launch_forkserver.usable()), ext_dir)
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
