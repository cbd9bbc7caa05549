"""A rank forked from the fork server takes what the server's imports fixed from the rank's own environment: the
caching allocator's settings (the alloc_conf knob) and huggingface_hub's offline switch (issue 23, defects 3 and 6).

Each test forks a real child of this process (which imported torch and huggingface_hub with neither variable set, as
the server does) and runs ``enter_request`` in it, as ``trials.forkserver`` does for every rank."""

from __future__ import annotations

import json
import os
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
