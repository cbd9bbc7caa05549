"""A fork server that fails to start (or refuses: its imports initialised CUDA) is not started again for every later
probe (10-25 s each): the "auto" launcher turns it off for the rest of the search (issue 23, defect 10)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.probing import forkserver as launch_forkserver
from tuner.probing.runner import ProbeRunner, choose_launcher
from tuner.settings import load_settings


def test_a_refused_zygote_turns_the_fork_server_off_for_the_search(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a real server process that exits at once, as the zygote does when its imports initialised CUDA
    shadow = tmp_path / "trials"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("")
    (shadow / "forkserver.py").write_text("raise SystemExit(4)\n")
    monkeypatch.chdir(tmp_path)  # `python -m trials.forkserver` finds the working directory's first
    monkeypatch.setattr(launch_forkserver, "_disabled", False)
    monkeypatch.setattr(launch_forkserver, "_server", None)
    started: list[int] = []
    real = launch_forkserver.ForkServer

    def counted(env: dict[str, str]) -> launch_forkserver.ForkServer:
        started.append(1)
        return real(env)

    monkeypatch.setattr(launch_forkserver, "ForkServer", counted)
    settings = load_settings(probe_launcher="auto")
    runner = ProbeRunner(settings)
    assert runner._server(choose_launcher(None, settings)) is None
    assert choose_launcher(None, settings) == "spawn"  # every later probe: fresh interpreters, no second start
    assert runner._server(choose_launcher(None, settings)) is None
    assert started == [1]
