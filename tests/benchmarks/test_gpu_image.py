"""The branches the GPU check takes on the GPU image (Python 3.12, torch 2.11.0+cu130, transformers 5.17.0, accelerate
1.15.0, TORCH_CUDA_ARCH_LIST 9.0a; DeepSpeed 0.19.8 from the kit), each decided here by the code that decides it
there, with that image's versions and APIs (issue 41 §5). Where a version's package is what decides, the deeper tests
install it (tests/tuner/interop/test_trainer_releases.py runs transformers 5.17.0's own Trainer); here torch 2.11's
allocator API is the API with its getter removed, and the rest are the version-keyed decisions themselves.

accelerate 1.15 and Python 3.12 key no branch on the check's path (accelerate's version matters to FSDP2 probes
alone; the interpreter only names the op cache's folder)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from benchmarks.gpu import commands, plan
from benchmarks.gpu.pinned_step import baseline_probe
from trials import alloc_settings
from trials.contract import PINNED_ALLOC_ENV
from trials.cuda_setup import eager_nccl_init
from trials.ds_schedule import scheduler_refusal
from trials.pinned import pinned_setup
from tuner.interop.trainer_fill import trainer_fill
from tuner.probing.arch_list import needs_rewrite, parseable_arch_list

ROOT = Path(__file__).resolve().parents[2]
IMAGE_TORCH = "2.11.0+cu130"


@pytest.mark.slow
def test_on_transformers_5_17_trial_0_is_refused_and_the_check_probes_their_run_as_it_ran(tmp_path: Path) -> None:
    """5.17 fills WarmupLR's "auto" warmup with 0 (the team's training args set none) and DeepSpeed 0.19.8 refuses 0:
    the search's trial 0 is refused there, as their Trainer would be on that host; the pinned variants and the crash
    study build trial 0 as their run ran (5.18's fill: warmup 1), which DeepSpeed builds."""
    assert not trainer_fill("5.17.0").clamps_warmup and trainer_fill("5.18.0").clamps_warmup
    paths = commands.Paths(ROOT, tmp_path)
    config = plan.from_env({})
    commands.write_inputs(config, paths)
    options = commands.pinned_options(config, paths)
    assert options["transformers_version"] == commands.THEIR_TRANSFORMERS == "5.18.0"
    image = baseline_probe({**options, "transformers_version": "5.17.0"}, 60).deepspeed or {}
    theirs = baseline_probe(options, 60)
    assert image["scheduler"]["params"]["warmup_num_steps"] == 0
    assert scheduler_refusal(image) == "ValueError: warmup_num_steps must be a positive integer, got 0"
    ds = theirs.deepspeed or {}
    assert ds["scheduler"]["params"]["warmup_num_steps"] == 1 and scheduler_refusal(ds) is None
    # trial 0 is their config: ZeRO-2, pinned CPU offload, their buckets and overlap_comm, on flan-t5-large
    assert theirs.knobs.offload_optimizer and theirs.knobs.zero_stage == 2 and theirs.knobs.overlap_comm
    assert ds["zero_optimization"]["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert theirs.model.source == "builtin:flan-t5-large" and theirs.knobs.max_length == 512


def test_on_torch_2_11_one_rank_makes_no_eager_nccl_communicator() -> None:
    assert not eager_nccl_init("cuda", 1, IMAGE_TORCH)  # the check's one rank
    assert eager_nccl_init("cuda", 2, IMAGE_TORCH)  # outside 2.6.0-2.7.1, whose eager init broke collectives


def test_the_images_arch_list_is_given_to_deepspeed_without_its_suffix() -> None:
    assert needs_rewrite("9.0a") and parseable_arch_list("9.0a", [(9, 0)]) == "9.0"


def _fork(tmp_path: Path, body: object) -> object:
    out = tmp_path / "child.json"
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            out.write_text(json.dumps(body()))  # type: ignore[operator]
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return json.loads(out.read_text())


@pytest.mark.skipif(alloc_settings.getter(torch._C) is None, reason="needs a torch that reads its settings back")
def test_on_torch_2_11_the_register_variant_needs_only_the_setter(tmp_path: Path) -> None:
    """torch 2.11 has ``_accelerator_setAllocatorSettings`` and no getter: the pinned variant never reads the
    settings back, it puts the rank's own first and back after (read here through the getter kept aside)."""

    def body() -> object:
        real_get = torch._C._accelerator_getAllocatorSettings
        delattr(torch._C, "_accelerator_getAllocatorSettings")
        assert alloc_settings.getter(torch._C) is None and alloc_settings.setter(torch._C) is not None
        env = {PINNED_ALLOC_ENV: "register:16", "PYTORCH_ALLOC_CONF": "expandable_segments:True"}
        with pinned_setup(True, env):
            during = real_get()
        return [during, real_get()]

    during, after = _fork(tmp_path, body)  # type: ignore[misc]
    assert during == "expandable_segments:True,pinned_use_cuda_host_register:True,pinned_num_register_threads:16"
    assert after == "expandable_segments:True,pinned_use_cuda_host_register:False,pinned_num_register_threads:1"
