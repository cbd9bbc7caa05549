"""Issue 24 §5: stored text with control characters (a study name with an ESC sequence and a newline, as an older
tuner stored it from `--study`) reaches the terminal without them, through every renderable the CLI prints."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

from rich.table import Table
from rich.text import Text

from tuner.cli.safe_console import SafeConsole, safe_text
from tuner.storage import Store

HOSTILE = "a\x1b[2J\x1b]0;pwned\x07b\rc\x9bd\ne"


def test_safe_text_replaces_c0_and_c1_but_keeps_newlines_and_tabs() -> None:
    assert safe_text(HOSTILE) == "a?[2J?]0;pwned?b?c?d\ne"
    assert safe_text("x\ty") == "x\ty"


def test_every_renderable_is_cleaned_and_rich_styling_still_works() -> None:
    out = io.StringIO()
    console = SafeConsole(file=out, force_terminal=True, color_system="standard", width=200, highlight=False)
    table = Table()
    table.add_column("name")
    table.add_row(Text(HOSTILE))
    console.print(HOSTILE, markup=False)
    console.print(Text(HOSTILE, style="bold"))
    console.print(table)
    printed = out.getvalue()
    assert "\x1b[2J" not in printed and "\x1b]0;" not in printed and "\x07" not in printed and "\r" not in printed
    assert "\x9b" not in printed, repr(printed)
    assert printed.count("a?[2J?]0;pwned") == 3, repr(printed)  # rich itself drops BEL and CR
    assert "\x1b[1m" in printed  # the console's own styling is kept


def test_tuner_studies_prints_a_stored_hostile_name_without_its_control_characters(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    Store(url).ensure_study(HOSTILE, {"device_memory": 1 << 29})
    done = subprocess.run(
        [sys.executable, "-m", "tuner", "studies", "--storage", url],
        capture_output=True,
        text=True,
        timeout=120,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout and "\x07" not in done.stdout and "\r" not in done.stdout, repr(done.stdout)
    assert "pwned" in done.stdout
