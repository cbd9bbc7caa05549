"""The live-tensor tracker (emulated device), the OOM predicate and the RLIMIT_DATA backstop, on real torch."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from trials.memory import LiveTensorTracker, is_oom, optimizer_tensors


def test_counts_each_storage_once_and_forgets_freed_ones() -> None:
    tracker = LiveTensorTracker()
    with tracker:
        a = torch.empty(1000, dtype=torch.float32)  # 4000 bytes
        view = a[10:20].view(2, 5)  # shares a's storage
        b = torch.ones(250, dtype=torch.float64)  # 2000 bytes
        assert tracker.live == 6000
        del b
        assert tracker.live == 4000
        c = a * 2  # a new 4000-byte result
    assert tracker.peak == 8000
    assert tracker.live == 8000
    del a, c
    assert tracker.live == 4000  # the view keeps a's storage alive
    del view
    assert tracker.live == 0


def test_capacity_raises_torch_out_of_memory_and_keeps_the_books() -> None:
    tracker = LiveTensorTracker(capacity=10_000)
    with tracker:
        keep = torch.empty(2000)  # 8000 bytes
        with pytest.raises(torch.OutOfMemoryError, match="emulated device out of memory"):
            torch.empty(1000)  # would make 12000
        assert tracker.live == 8000
        assert tracker.oom_need == 12_000  # what it was asked for: a lower bound of the step's need
        small = torch.empty(500)  # 2000 bytes fit exactly
        assert tracker.live == tracker.peak == 10_000
    del keep, small
    assert tracker.live == 0


def test_matches_an_adamw_step_by_hand() -> None:
    model = torch.nn.Linear(64, 32)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    tracker = LiveTensorTracker()
    tracker.track(model.parameters())
    assert tracker.live == params
    opt = torch.optim.AdamW(model.parameters(), foreach=False)
    with tracker:
        for _ in range(2):
            model(torch.randn(8, 64)).sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    state = sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values())
    assert tracker.live == params + state  # grads freed, batch freed; AdamW's exp_avg/exp_avg_sq (+ step) stay
    assert tracker.peak >= params + state + params  # params + state + grads at the second step


def test_mark_host_takes_offloaded_state_off_the_device() -> None:
    model = torch.nn.Linear(16, 16)
    opt = torch.optim.AdamW(model.parameters(), foreach=False)
    tracker = LiveTensorTracker()
    with tracker:
        model(torch.randn(4, 16)).sum().backward()
        with tracker.paused():
            opt.step()  # a host-side step: its new state is never counted
    assert tracker.live == sum(p.grad.numel() * 4 for p in model.parameters())
    grads = tracker.live
    assert tracker.mark_host(optimizer_tensors(opt)) == grads  # params were never on the tracked device
    assert tracker.live == 0
    with tracker:
        model.weight.grad.mul_(2)  # in-place on a host storage: still not device memory
        extra = torch.empty(10)
    assert tracker.live == 40
    del extra


def test_works_under_fake_tensor_mode() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    tracker = LiveTensorTracker()
    with FakeTensorMode(), tracker:
        x = torch.empty(1 << 20)  # 4 MiB, never materialised
        y = x @ x.new_empty(1 << 20, 1)
        assert tracker.live == (4 << 20) + 4  # the (1<<20, 1) operand was a temporary
        del x, y
    assert tracker.peak == (8 << 20) + 4
    assert tracker.live == 0


def test_a_dtensor_counts_its_local_shard_not_its_global_size() -> None:
    """FSDP2's parameters, gradients and AdamW states are DTensors whose own (wrapper) storage has the global size: on
    2 ranks each holds half. Counted by the wrapper, an FSDP2 probe of tiny-llama on 2 ranks read 3.57 MB instead of
    3.07 MB (micro 2 x 64)."""
    import torch.distributed as dist
    from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    try:
        mesh = init_device_mesh("cpu", (2,))
        weight = distribute_tensor(torch.randn(1024, 256), mesh, [Shard(0)])
        assert weight.untyped_storage().nbytes() == 1 << 20  # the wrapper: global
        tracker = LiveTensorTracker()
        tracker.track([weight])
        assert tracker.live == 1 << 19  # the shard
        with tracker:
            doubled = weight * 2  # a DTensor result: its shard is what this rank allocates
            assert tracker.live == 1 << 20
            assert tracker.mark_host([doubled]) == 1 << 19  # offloaded by its shard
        assert tracker.live == 1 << 19
        del doubled
    finally:
        dist.destroy_process_group()


def test_oom_predicate() -> None:
    assert is_oom(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_oom(MemoryError())
    assert is_oom(
        RuntimeError(
            "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: "
            "you tried to allocate 8000000000 bytes. Error code 12 (Cannot allocate memory)"
        )
    )
    assert not is_oom(RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x3 and 4x3)"))
    assert not is_oom(ValueError("out of memory"))


def test_rlimit_backstop_gives_a_real_cpu_allocator_oom() -> None:
    code = textwrap.dedent("""
        import torch
        from trials.memory import is_oom, set_data_limit
        set_data_limit(64 << 20, slack=64 << 20)
        try:
            torch.empty(1 << 30, dtype=torch.uint8).fill_(1)
        except Exception as exc:
            print("oom" if is_oom(exc) else "other: " + repr(exc))
        small = torch.ones(1 << 20)  # the process stays usable
        print(int(small.sum()))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["oom", str(1 << 20)]
