"""The docs site builds with warnings as errors (`mkdocs build --strict`, what CI runs here), fetching nothing, and its
command reference is the command line's own: every command and every option `tuner` has is on the page, in the
groups its --help shows."""

from __future__ import annotations

import html
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.docs_blocks import ROOT


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "HOME": str(out), "NO_MKDOCS_2_WARNING": "1", **_python_path()},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def _python_path() -> dict[str, str]:
    import os

    return {"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {}


def _text(page: Path) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))


def test_the_site_builds_strictly_with_every_page(site: Path) -> None:
    for page in ("index", "getting-started", "guides/why-it-crashed", "reference/cli", "benchmarks", "DESIGN-NOTES"):
        assert (site / page / "index.html").is_file() or (site / f"{page}.html").is_file(), page
    benchmarks = _text(site / "benchmarks" / "index.html")
    first = (ROOT / "benchmarks" / "BENCHMARKS.md").read_text().splitlines()[0].lstrip("# ")
    assert first in benchmarks  # included as it is, from benchmarks/
    assert "fonts.googleapis" not in (site / "index.html").read_text()  # nothing fetched when the page is read


def test_the_command_reference_is_every_command_and_option_of_the_cli(site: Path) -> None:
    import typer

    from tuner.cli.app import COMMAND_ORDER, _register, app

    _register()
    page = _text(site / "reference" / "cli" / "index.html")
    root = typer.main.get_command(app)
    for name in COMMAND_ORDER:
        command = root.commands[name]  # type: ignore[attr-defined]
        assert f"tuner {name}" in page, name
        for sub in [command, *getattr(command, "commands", {}).values()]:
            for param in sub.params:
                for option in param.opts:
                    assert option in page, (name, option)
                if getattr(param, "rich_help_panel", None):
                    assert param.rich_help_panel in page, (name, param.rich_help_panel)
    positions = [page.index(f"tuner {name}\n") for name in COMMAND_ORDER if f"tuner {name}\n" in page]
    assert positions == sorted(positions) and len(positions) == len(COMMAND_ORDER)  # the workflow's order
