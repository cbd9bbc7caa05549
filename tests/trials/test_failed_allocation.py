"""The emulated device records the allocation it refused (issue 22 §1): the op, shape and dtype that asked, the bytes
in use at that instant, and the stage of the train step (a module's forward, the backward, a torch optimizer's step),
bounded; and the CUDA snapshot's decisions (trials.oom_snapshot), pure, on CPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trials.contract import FAILED_SHAPE_DIMS, FailedAllocation, RankMemory
from trials.memory import LiveTensorTracker, refused
from trials.oom_snapshot import (
    MAX_SNAPSHOT_BYTES,
    SNAPSHOT_ENV,
    OomSnapshot,
    failed_from_observer,
    kept,
    snapshot_path,
    wanted,
)


class Wide(torch.nn.Module):
    """A forward whose output is ``width`` floats a sample (the allocation that fails in the tests)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


def _over(tracker: LiveTensorTracker, run) -> FailedAllocation:
    with tracker, pytest.raises(torch.OutOfMemoryError):
        run()
    assert tracker.refused is not None
    return tracker.refused


def test_outside_any_step_the_op_shape_and_bytes_in_use_are_recorded() -> None:
    tracker = LiveTensorTracker(capacity=10_000)
    keep = [torch.empty(0)]

    def run() -> None:
        keep.append(torch.empty(1500))  # 6000 bytes live
        torch.ones(3, 500)  # 6000 more: refused

    failed = _over(tracker, run)
    assert (failed.nbytes, failed.live, failed.capacity) == (6000, 6000, 10_000)
    assert (failed.op, failed.shape, failed.dtype, failed.stage) == ("ones.default", [3, 500], "float32", None)


def test_a_forward_is_the_forward_stage() -> None:
    model = Wide(4096)
    x = torch.randn(16, 8)
    tracker = LiveTensorTracker(capacity=16 * 4096 * 4 - 1)
    failed = _over(tracker, lambda: model(x))
    assert failed.stage == "forward" and failed.shape == [16, 4096] and failed.nbytes == 16 * 4096 * 4
    assert tracker._hooks == []  # the global hooks go with the mode


def test_the_backward_and_the_optimizer_step_are_their_stages() -> None:
    model = Wide(64)
    x = torch.randn(4, 8)
    opt = torch.optim.AdamW(model.parameters(), foreach=False)
    params = sum(p.numel() * 4 for p in model.parameters())
    tracker = LiveTensorTracker(capacity=params + 4 * 64 * 4 + 4)  # the forward fits; the grads do not
    tracker.track(model.parameters())
    with tracker:
        loss = model(x).sum()
    with pytest.raises(torch.OutOfMemoryError), tracker:
        loss.backward()
    assert tracker.refused is not None and tracker.refused.stage == "backward"
    del loss
    model(x).sum().backward()  # untracked: the grads exist
    tracker = LiveTensorTracker(capacity=params * 2 + 4)  # params + grads fit; AdamW's first state does not
    tracker.track(model.parameters())
    tracker.track(p.grad for p in model.parameters())
    with pytest.raises(torch.OutOfMemoryError), tracker:
        opt.step()
    assert tracker.refused is not None and tracker.refused.stage == "optimizer step"


def test_the_record_is_bounded() -> None:
    t = torch.empty([1] * 12)
    failed = refused("x" * 500, t, 4, 0, None, None)
    assert len(failed.op or "") <= 120 and len(failed.shape) == FAILED_SHAPE_DIMS
    memory = RankMemory(rank=0, failed_allocation=failed)
    assert RankMemory.model_validate_json(memory.model_dump_json()) == memory  # it travels in the rank's result


def test_the_cuda_snapshot_decisions() -> None:
    assert wanted("cuda", {}, has_api=True)
    assert not wanted("cuda", {SNAPSHOT_ENV: "0"}, has_api=True)
    assert not wanted("cuda", {}, has_api=False) and not wanted("cpu", {}, has_api=True)
    assert snapshot_path(Path("/w/result.rank1.json")) == Path("/w/result.rank1.snapshot.pickle")
    assert kept(1) and kept(MAX_SNAPSHOT_BYTES) and not kept(MAX_SNAPSHOT_BYTES + 1) and not kept(0)
    failed = failed_from_observer(alloc=2 << 30, allocated=None, capacity=80 << 30)
    assert (failed.nbytes, failed.live, failed.op, failed.capacity) == (2 << 30, 0, None, 80 << 30)


def test_the_cuda_snapshot_is_inert_off_cuda(tmp_path: Path) -> None:
    snap = OomSnapshot(torch.device("cpu"), tmp_path / "s.pickle", None)
    with snap:
        torch.empty(10)
    assert not snap.enabled and snap.failed is None and snap.written is None
    assert not (tmp_path / "s.pickle").exists()
