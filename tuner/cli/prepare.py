"""`tuner prepare`: compiles the DeepSpeed ops probes load (cpu_adam; shm_comm without GPUs, fused_adam with them)
into the op cache, once per environment, each on its own, and says what became of each: built (and how long it
took), cached, not needed on this accelerator, or failed with the compiler's reason.

Optional — a search builds what a probe needs before that probe's clock starts, and refuses a config whose op could
not be built — but run ahead of a search it keeps the one-off compile (tens of seconds idle, minutes on a busy host)
out of the search's budget. Exit 1 when an op failed: the probes that need it would be refused.
"""

from __future__ import annotations

import typer

from tuner.cli.app import SETUP, app, example
from tuner.settings import load_settings


@app.command("prepare", rich_help_panel=SETUP, epilog=example("tuner prepare"))
def prepare() -> None:
    """Compile the DeepSpeed ops the probes load into the op cache (once per Python environment), one by one."""
    from tuner.cli.app import err_console
    from tuner.probing.arch_list import ARCH_ENV
    from tuner.probing.environment import probe_env
    from tuner.probing.gpus import has_visible_gpus
    from tuner.probing.ops import build_ops, prepare_ops

    env = probe_env(1)
    gpu_host = has_visible_gpus(env)
    ext_dir = load_settings().torch_extensions_dir
    typer.echo(
        f"op cache {ext_dir}" + (f" (CUDA arch list {env.get(ARCH_ENV) or 'of the device'})" if gpu_host else "")
    )
    builds = build_ops(prepare_ops(gpu_host), env)
    for build in builds:
        typer.echo(f"  {build.line()}")
    failed = [b.op for b in builds if b.outcome == "failed"]
    if failed:
        err_console.print(
            f"error: could not build DeepSpeed op(s) {', '.join(failed)}: probes that load them are refused; "
            f"`python -m trials.ops {' '.join(failed)}` rebuilds them (needs gcc, ninja and the Python headers"
            + (", and nvcc for fused_adam" if gpu_host else "")
            + ")",
            markup=False,
        )
        raise typer.Exit(1)
