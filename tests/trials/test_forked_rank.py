"""A rank forked from the fork server takes what the server's imports fixed from the rank's own environment: the
caching allocator's settings (the alloc_conf knob) and huggingface_hub's offline switch (issue 23, defects 3 and 6).

Each test forks a real child of this process (which imported torch and huggingface_hub with neither variable set, as
the server does) and runs ``enter_request`` in it, as ``trials.forkserver`` does for every rank."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import huggingface_hub.constants
import pytest
import torch

from trials.forkserver import enter_request


def _in_fork(tmp_path: Path, env: dict[str, str]) -> dict[str, object]:
    out = tmp_path / "child.json"
    pid = os.fork()
    if pid == 0:  # the child: what trials.forkserver._child does before the probe, then report
        code = 1
        try:
            enter_request(env, str(tmp_path))
            getter = getattr(torch._C, "_accelerator_getAllocatorSettings", lambda: None)
            import huggingface_hub.constants as hub

            out.write_text(json.dumps({"alloc": getter(), "offline": hub.HF_HUB_OFFLINE, "hub": hub.is_offline_mode()}))
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return dict(json.loads(out.read_text()))


@pytest.mark.skipif(
    not hasattr(torch._C, "_accelerator_setAllocatorSettings"), reason="this torch cannot set them at run time"
)
def test_a_forked_rank_runs_with_the_allocator_settings_of_its_own_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    assert torch._C._accelerator_getAllocatorSettings() == ""  # the parent (the server) runs with none
    asked = "expandable_segments:True"
    env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": asked, "PYTORCH_ALLOC_CONF": asked}
    assert _in_fork(tmp_path, env)["alloc"] == asked


def test_a_forked_rank_honours_hf_hub_offline_of_its_own_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    assert huggingface_hub.constants.HF_HUB_OFFLINE is False  # fixed at the parent's import
    seen = _in_fork(tmp_path, {**os.environ, "HF_HUB_OFFLINE": "1"})
    assert seen["offline"] is True and seen["hub"] is True
    assert _in_fork(tmp_path, dict(os.environ))["offline"] is False


def _fork_running(tmp_path: Path, body: Callable[[], object]) -> object:
    out = tmp_path / "child.json"
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            out.write_text(json.dumps(body()))
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return json.loads(out.read_text())


def _as_torch_2_11(server: str) -> Callable[[], str]:
    """In a forked child: the server's import parsed ``server``; then torch 2.11's API (the setter, no getter).
    Returns the real getter, to read what is in force."""
    import trials.forkserver as fs

    real_get = torch._C._accelerator_getAllocatorSettings
    torch._C._accelerator_setAllocatorSettings(server)
    fs._SERVER_ALLOC_ENV.update({name: server for name in fs._SERVER_ALLOC_ENV})
    delattr(torch._C, "_accelerator_getAllocatorSettings")
    return real_get  # type: ignore[no-any-return]


@pytest.mark.skipif(
    not hasattr(torch._C, "_accelerator_getAllocatorSettings"), reason="needs a torch that reads its settings back"
)
@pytest.mark.parametrize(
    ("server", "asked", "in_force"),
    [
        ("", "expandable_segments:True", "expandable_segments:True"),
        ("expandable_segments:True", "", "expandable_segments:False"),
        (
            "expandable_segments:True",
            "garbage_collection_threshold:0.6",
            "garbage_collection_threshold:0.6,expandable_segments:False",  # what the server named, at torch's default
        ),
        ("expandable_segments:True", "expandable_segments:True", "expandable_segments:True"),  # nothing to change
    ],
)
def test_on_torch_2_11_with_the_setter_alone_a_forked_rank_runs_with_its_own_settings(
    tmp_path: Path, server: str, asked: str, in_force: str
) -> None:
    """torch 2.11 (the GPU image's) has ``_accelerator_setAllocatorSettings`` but no getter: the branch the fork
    server takes there, run here with the getter removed. Before, the rank fell back to the server's settings and
    the alloc_conf knob was never in force in a forked rank on that torch."""
    from trials.contract import alloc_conf_in_force

    def body() -> object:
        real_get = _as_torch_2_11(server)
        enter_request({**_no_alloc_env(), **({"PYTORCH_CUDA_ALLOC_CONF": asked} if asked else {})}, str(tmp_path))
        return [real_get(), alloc_conf_in_force(os.environ) or ""]

    seen, recorded = _fork_running(tmp_path, body)  # type: ignore[misc]
    assert (seen, recorded) == (in_force, asked)


def test_on_a_torch_without_the_setter_the_rank_records_the_servers_settings(tmp_path: Path) -> None:
    """torch < 2.9: nothing can change the settings after import; the rank's environment (its fingerprint) says the
    server's, what is in force."""
    import trials.forkserver as fs
    from trials.contract import alloc_conf_in_force

    def body() -> object:
        fs._SERVER_ALLOC_ENV.update({name: "expandable_segments:True" for name in fs._SERVER_ALLOC_ENV})
        for name in ("_accelerator_getAllocatorSettings", "_accelerator_setAllocatorSettings"):
            if hasattr(torch._C, name):
                delattr(torch._C, name)
        enter_request({**_no_alloc_env(), "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"}, str(tmp_path))
        return alloc_conf_in_force(os.environ)

    assert _fork_running(tmp_path, body) == "expandable_segments:True"


def _no_alloc_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}
