"""The CUDA arch list DeepSpeed's builds and probes get (issue 30 §1): Hopper's "9.0a" broke every op build on an H200
(DeepSpeed 0.19.8 parses entries with int()). Reproduced here through DeepSpeed's own CUDA builder code, on CPU."""

from __future__ import annotations

import os

import pytest

from tuner.probing import environment, gpus
from tuner.probing.arch_list import ARCH_ENV, needs_rewrite, parseable_arch_list


@pytest.mark.parametrize(
    ("user", "caps", "expected"),
    [
        ("9.0a", (), "9.0"),
        ("10.0a+PTX", (), "10.0+PTX"),
        ("8.0;9.0a;10.0a+PTX", (), "8.0;9.0;10.0+PTX"),
        ("8.0 9.0a  12.0f", (), "8.0;9.0;12.0"),
        ("9.0;9.0a+PTX", (), "9.0+PTX"),  # one entry per arch, +PTX if any variant had it
        ("Hopper", [(9, 0)], "9.0"),  # a name DeepSpeed cannot parse: the visible devices' capabilities
        (None, [(8, 0), (9, 0)], "8.0;9.0"),
        ("", [], None),
        ("8.6", [(9, 0)], "8.6"),  # the user's list wins when it parses
    ],
)
def test_the_list_deepspeed_parses(user, caps, expected):
    assert parseable_arch_list(user, caps) == expected


def test_which_lists_need_a_rewrite():
    assert needs_rewrite("9.0a") and needs_rewrite("8.0;Hopper") and needs_rewrite("10.0f+PTX")
    assert not needs_rewrite("8.0;9.0+PTX") and not needs_rewrite("") and not needs_rewrite(None)


def _deepspeed_parses(arch: str, monkeypatch: pytest.MonkeyPatch) -> str:
    from deepspeed.ops.op_builder.fused_adam import FusedAdamBuilder  # the CUDA builder, importable on CPU

    monkeypatch.setenv(ARCH_ENV, arch)
    builder = FusedAdamBuilder()
    builder.jit_mode = True  # as in builder.load() -> jit_load()
    assert builder.compute_capability_args() == []  # JIT: torch makes the -gencode flags from the variable
    return os.environ[ARCH_ENV]


def test_deepspeeds_builder_refuses_the_suffix_and_parses_ours(monkeypatch):
    with pytest.raises(ValueError, match="invalid literal for int"):
        _deepspeed_parses("9.0a", monkeypatch)
    assert _deepspeed_parses(parseable_arch_list("9.0a") or "", monkeypatch) == "9.0+PTX"
    assert _deepspeed_parses(parseable_arch_list("8.0;9.0a;10.0a+PTX") or "", monkeypatch) == "8.0;9.0;10.0+PTX"


def test_probe_env_gives_the_ranks_a_parseable_list_and_leaves_the_users_alone(monkeypatch, tmp_path):
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(ARCH_ENV, "9.0a")
    monkeypatch.setattr(gpus, "has_visible_gpus", lambda env=None: True)  # NVML's answers, at the edge
    monkeypatch.setattr(gpus, "visible_capabilities", lambda env=None: [(9, 0)])
    env = environment.probe_env(1)
    assert env[ARCH_ENV] == "9.0"
    assert os.environ[ARCH_ENV] == "9.0a"  # the user's own environment is untouched
    monkeypatch.delenv(ARCH_ENV)
    assert environment.probe_env(1)[ARCH_ENV] == "9.0"  # none set: the visible devices' capabilities
    monkeypatch.setenv(ARCH_ENV, "8.6+PTX")
    assert environment.probe_env(1)[ARCH_ENV] == "8.6+PTX"  # a list DeepSpeed parses is kept as it is


def test_a_host_without_gpus_keeps_whatever_is_set(monkeypatch, tmp_path):
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(ARCH_ENV, "9.0a")
    monkeypatch.setattr(gpus, "has_visible_gpus", lambda env=None: False)
    assert environment.probe_env(1)[ARCH_ENV] == "9.0a"  # DeepSpeed's CPU accelerator builds no CUDA op


def test_no_gpu_here_means_no_capabilities():
    assert gpus.visible_capabilities({"CUDA_VISIBLE_DEVICES": ""}) == []
