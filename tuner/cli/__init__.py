"""The `tuner` command line (typer + rich). Each command group lives in its own module and registers on ``app``."""

from tuner.cli.app import app, main

__all__ = ["app", "main"]
