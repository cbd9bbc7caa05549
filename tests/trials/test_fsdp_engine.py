"""The FSDP2 engine (trials.fsdp) in real probes on 2 gloo ranks: accelerate's own FSDP2 preparation shards the model
(every test asserts the shards, never only that it trained), the emulated device counts FSDP2's storage resizes, the
knobs move memory the way FSDP2 does, T5's shared parameter is one refusal said once, an OOM keeps its allocation."""

from __future__ import annotations

import pytest
import torch

from trials.contract import Knobs, ModelSpec, ProbeConfig, Status
from trials.fsdp_storage import counted_resizes
from trials.memory import LiveTensorTracker
from tuner.probing.config import probe_config
from tuner.probing.runner import ProbeRunner
from tuner.settings import load_settings

LLAMA = ModelSpec(source="builtin:tiny-llama")


def fsdp(**knobs: object) -> Knobs:
    return Knobs(**{"micro_batch_size": 2, "max_length": 64, "engine": "fsdp2", **knobs})


def config(knobs: Knobs, model: ModelSpec = LLAMA, **fields: object) -> ProbeConfig:
    return probe_config(knobs=knobs, model=model, world_size=2, warmup_steps=2, measure_steps=2, **fields)


@pytest.fixture(scope="module")
def runner() -> ProbeRunner:
    return ProbeRunner(load_settings())


@pytest.fixture(scope="module")
def resharded(runner: ProbeRunner):  # type: ignore[no-untyped-def]
    return runner(config(fsdp()))


def test_probe_shards_for_real_on_both_ranks(resharded) -> None:  # type: ignore[no-untyped-def]
    assert resharded.status == Status.OK, resharded.cause
    assert resharded.sharded is True  # every parameter a DTensor shard on every rank, not a replicated (DDP) model
    assert len(resharded.ranks) == 2 and resharded.samples_per_s
    assert "accelerate" in resharded.versions  # the preparation is accelerate's: its release goes with the result
    assert resharded.setup_phases["engine.shard"] > 0


def test_keeping_gathered_blocks_needs_more_and_offload_less(runner: ProbeRunner, resharded) -> None:  # type: ignore[no-untyped-def]
    kept = runner(config(fsdp(reshard_after_forward=False)))
    offload = runner(config(fsdp(offload_params=True)))
    for result in (kept, offload):
        assert result.status == Status.OK and result.sharded is True, result.cause
    # the blocks' gathered parameters stay to the backward: the storages FSDP2 resizes in place are counted
    assert kept.phase_peaks["train"] > resharded.phase_peaks["train"]
    # the shards, their gradients and AdamW's state live on the host
    assert offload.phase_peaks["train"] < resharded.phase_peaks["train"]


def test_an_oom_keeps_its_failed_allocation(runner: ProbeRunner, resharded) -> None:  # type: ignore[no-untyped-def]
    budget = resharded.phase_peaks["train"] * 2 // 3
    result = runner(config(fsdp(), device_memory=budget))
    assert result.status == Status.OOM
    failed = [r.failed_allocation for r in result.ranks if r.failed_allocation is not None]
    assert failed and failed[0].capacity == budget and failed[0].phase == "train"


def test_t5_shared_parameter_is_one_refusal_said_once(runner: ProbeRunner) -> None:
    t5 = ModelSpec(source="builtin:tiny-t5")
    first = runner(config(fsdp(), model=t5))
    assert first.status == Status.REFUSED
    assert first.cause is not None and "\n" not in first.cause
    assert "'shared.weight'" in first.cause and "engine deepspeed" in first.cause
    again = runner(config(fsdp(micro_batch_size=4, reshard_after_forward=False), model=t5))
    assert again.status == Status.REFUSED and "not launched" in (again.cause or "") and again.wall_s == 0
    # another engine of the same model, and the same engine of another model, still run
    assert runner.engine_refused and all("tiny-t5" in key for key in runner.engine_refused)


def test_storage_resizes_are_counted_while_tracking() -> None:
    from torch.distributed.fsdp._fully_shard import _fsdp_param

    tracker = LiveTensorTracker()
    with tracker:
        t = torch.empty(1024)
    assert tracker.live == 4096
    with tracker:
        _fsdp_param.free_storage(t)
        assert tracker.live == 0
        _fsdp_param.alloc_storage(t)
        assert tracker.live == 4096
    original = _fsdp_param.free_storage
    with counted_resizes(lambda _t: None):
        assert _fsdp_param.free_storage is not original
    assert _fsdp_param.free_storage is original  # restored: outside a tracker torch's own functions run
