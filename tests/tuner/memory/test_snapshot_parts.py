"""A CUDA memory snapshot read back as the estimate's parts (tuner.memory.snapshot_parts): each rule on the frame it
names, the innermost frame first, the sums over a snapshot in torch's format (torch.cuda.memory._snapshot's
documented dict), the bounds, the refusal of anything but plain data, and a snapshot torch itself builds on CPU
(torch.cuda._memory_viz._profile_to_snapshot of a profiled train step)."""

from __future__ import annotations

import collections
import os
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch

from tuner.memory.breakdown import (
    ACTIVATIONS,
    GENERATION_CACHE,
    GRADIENTS,
    OPTIMIZER,
    PARAMETERS,
    PARTS,
    ZERO_BUFFERS,
)
from tuner.memory.snapshot_child import read
from tuner.memory.snapshot_parts import RULES, attribute, loads, part_of, rule_of

GiB = 1 << 30
MiB = 1 << 20
SITE = "/usr/lib/python3.11/site-packages"


def frame(filename: str, name: str, line: int = 1) -> dict[str, Any]:
    """A frame as torch's snapshot has it (Frame: filename, line, name)."""
    return {"filename": filename, "line": line, "name": name}


def block(size: int, frames: list[dict[str, Any]], state: str = "active_allocated", address: int = 0) -> dict[str, Any]:
    """A block as torch's snapshot has it (Block: size, requested_size, address, state, frames)."""
    return {"size": size, "requested_size": size, "address": address, "state": state, "frames": frames}


def snapshot(*blocks: dict[str, Any]) -> dict[str, Any]:
    """torch.cuda.memory._snapshot()'s dict (Snapshot: segments, device_traces) with one segment holding ``blocks``."""
    total = sum(b["size"] for b in blocks)
    live = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    segment = {
        "device": 0,
        "address": 0,
        "total_size": total,
        "stream": 0,
        "segment_type": "large",
        "segment_pool_id": (0, 0),
        "allocated_size": live,
        "active_size": live,
        "blocks": list(blocks),
    }
    oom = {"action": "oom", "size": 2 * GiB, "stream": 0, "device_free": 0, "frames": [], "pool_id": (0, 0)}
    return {"segments": [segment], "device_traces": [[oom]]}


#: one stack per rule, innermost frame first, as the probe's allocations leave them: (frames, the part)
EXAMPLES: list[tuple[list[dict[str, Any]], str]] = [
    (
        [frame(f"{SITE}/transformers/cache_utils.py", "update"), frame("/w/trials/decode.py", "fixed_length_decode")],
        GENERATION_CACHE,
    ),
    (
        [frame(f"{SITE}/deepspeed/runtime/zero/stage_1_and_2.py", "reduce_independent_p_g_buckets_and_remove_grads")],
        ZERO_BUFFERS,
    ),
    ([frame(f"{SITE}/torch/distributed/distributed_c10d.py", "all_gather_into_tensor")], ZERO_BUFFERS),
    ([frame(f"{SITE}/torch/optim/adamw.py", "_init_group")], OPTIMIZER),
    ([frame(f"{SITE}/deepspeed/ops/adam/fused_adam.py", "step")], OPTIMIZER),
    ([frame(f"{SITE}/deepspeed/runtime/zero/stage_1_and_2.py", "_create_fp32_partitions")], OPTIMIZER),
    ([frame(f"{SITE}/transformers/modeling_utils.py", "from_pretrained")], PARAMETERS),
    ([frame(f"{SITE}/torch/nn/modules/module.py", "_apply"), frame("/w/trials/probe.py", "_build_model")], PARAMETERS),
    ([frame(f"{SITE}/transformers/models/t5/modeling_t5.py", "forward")], ACTIVATIONS),
    ([frame(f"{SITE}/torch/autograd/graph.py", "_engine_run_backward")], GRADIENTS),
    ([frame("/w/trials/decode.py", "fixed_length_decode")], GENERATION_CACHE),
]


@pytest.mark.parametrize(("frames", "part"), EXAMPLES)
def test_each_rule_names_its_part(frames: list[dict[str, Any]], part: str) -> None:
    assert part_of(frames) == part


def test_every_rule_is_reached_by_an_example() -> None:
    assert {rule_of(frames) for frames, _ in EXAMPLES} == set(RULES)


def test_the_innermost_frame_decides() -> None:
    adamw_under_zero_step = [
        frame(f"{SITE}/torch/optim/adamw.py", "_init_group"),
        frame(f"{SITE}/deepspeed/runtime/zero/stage_1_and_2.py", "step"),
        frame(f"{SITE}/deepspeed/runtime/engine.py", "step"),
    ]
    recomputed_in_backward = [
        frame(f"{SITE}/transformers/models/t5/modeling_t5.py", "forward"),
        frame(f"{SITE}/torch/utils/checkpoint.py", "recompute_fn"),
        frame(f"{SITE}/torch/autograd/graph.py", "_engine_run_backward"),
    ]
    gather_in_zero = [
        frame(f"{SITE}/torch/distributed/distributed_c10d.py", "all_gather_into_tensor"),
        frame(f"{SITE}/deepspeed/runtime/zero/stage_1_and_2.py", "step"),
    ]
    unknown_then_backward = [frame("/w/mine.py", "helper"), frame(f"{SITE}/torch/_tensor.py", "backward")]
    assert part_of(adamw_under_zero_step) == OPTIMIZER
    assert part_of(recomputed_in_backward) == ACTIVATIONS
    assert part_of(gather_in_zero) == ZERO_BUFFERS
    assert part_of(unknown_then_backward) == GRADIENTS
    assert part_of([frame("/w/mine.py", "helper")]) is None and part_of([]) is None


def test_live_blocks_are_summed_per_part_and_the_rest_is_named() -> None:
    adam = [frame(f"{SITE}/torch/optim/adamw.py", "_init_group")]
    mine = [frame("/w/jobs/custom_loss.py", "smooth", 42)]
    s = snapshot(
        block(2 * GiB, adam),
        block(1 * GiB, adam, address=2 * GiB),
        block(3 * GiB, []),  # allocated before the recording started
        block(512 * MiB, mine),
        block(256 * MiB, mine),
        block(64 * MiB, [frame("/w/jobs/other.py", "pad", 7)]),
        block(4 * GiB, adam, state="inactive"),  # cached, not live
        block(1 * GiB, adam, state="active_awaiting_free"),  # freed, waiting on a stream: no tensor holds it
    )
    got = attribute(s, "x.pickle")
    assert got.part(OPTIMIZER) == 3 * GiB and all(got.part(p) == 0 for p in PARTS if p != OPTIMIZER)
    assert got.before_recording == 3 * GiB and got.unattributed == 832 * MiB
    assert got.live == 3 * GiB + 3 * GiB + 832 * MiB and got.reserved == s["segments"][0]["total_size"]
    assert [(c.frame, c.nbytes, c.blocks) for c in got.unattributed_sites] == [
        ("jobs/custom_loss.py:42:smooth", 768 * MiB, 2),
        ("jobs/other.py:7:pad", 64 * MiB, 1),
    ]
    assert got.blocks == 8 and not got.cut


def trace_entry(action: str, addr: int, size: int, frames: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """An entry of torch's allocation trace (TraceEntry: action, addr, size, stream, frames, time_us)."""
    return {"action": action, "addr": addr, "size": size, "stream": 0, "frames": frames or [], "time_us": 0}


def test_backward_blocks_without_python_frames_are_gradients_by_the_recordings_trace(tmp_path: Path) -> None:
    """With stacks="python" (the probe's recording) the blocks the autograd engine's own thread allocates on CUDA
    carry no Python frames, as do the blocks allocated before the recording started; only the former have an alloc
    in the recording's trace (device_traces) at their address. Before, both read as "before recording" and the
    gradients of an OOM in the backward showed as setup."""
    adam = [frame(f"{SITE}/torch/optim/adamw.py", "_init_group")]
    s = snapshot(
        block(3 * GiB, [], address=0),  # the parameters, built before the recording
        block(2 * GiB, [], address=3 * GiB),  # a gradient: the autograd thread's, no frames
        block(1 * GiB, [], address=5 * GiB),  # freed and allocated again at the same address by the backward
        block(1 * GiB, adam, address=6 * GiB),
        block(512 * MiB, [], address=7 * GiB),  # its alloc fell out of the trace's ring: read as before
    )
    s["device_traces"] = [
        [
            trace_entry("alloc", 5 * GiB, GiB),
            trace_entry("free_requested", 5 * GiB, GiB),
            trace_entry("free_completed", 5 * GiB, GiB),
            trace_entry("alloc", 9 * GiB, GiB),  # a temporary, gone by the dump
            trace_entry("free_completed", 9 * GiB, GiB),
            trace_entry("alloc", 3 * GiB, 2 * GiB),
            trace_entry("alloc", 5 * GiB, GiB),
            trace_entry("alloc", 6 * GiB, GiB, adam),
            *s["device_traces"][0],  # the OOM
        ]
    ]
    got = attribute(s)
    assert got.part(GRADIENTS) == 3 * GiB and got.unframed == 3 * GiB
    assert got.before_recording == 3 * GiB + 512 * MiB and got.part(OPTIMIZER) == GiB and got.unattributed == 0
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(s))
    read_back = read(str(path)).parts  # through the child that reads untrusted files
    assert read_back is not None and read_back.unframed == 3 * GiB and read_back.part(GRADIENTS) == 3 * GiB
    no_trace = attribute(snapshot(block(GiB, [], address=0)))  # a snapshot without a trace: as before
    assert no_trace.before_recording == GiB and no_trace.unframed == 0


def test_a_trace_that_is_not_torchs_is_read_as_no_trace() -> None:
    s = snapshot(block(GiB, [], address=0))
    for odd in ([["x", {"action": "alloc", "addr": "0"}, {"action": "alloc", "addr": True}]], "x", [None]):
        s["device_traces"] = odd
        got = attribute(s)
        assert got.before_recording == GiB and got.unframed == 0


def test_a_snapshot_with_more_blocks_than_the_bound_is_cut_and_says_so() -> None:
    adam = [frame(f"{SITE}/torch/optim/adamw.py", "_init_group")]
    got = attribute(snapshot(*(block(MiB, adam) for _ in range(10))), max_blocks=4)
    assert got.cut and got.blocks == 4 and got.part(OPTIMIZER) == 4 * MiB


class _Runs:
    """A pickle that would run a command when unpickled unsafely."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def test_only_plain_data_is_unpickled(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps({"segments": [_Runs(marker)]}))
    got = read(str(path))
    assert got.parts is None and got.error is not None and not marker.exists()
    assert got.error.startswith("refused: it names ") and "system" in got.error
    ordered = read_bytes(tmp_path, pickle.dumps(collections.OrderedDict(segments=[])))
    assert (
        ordered.error == "refused: it names collections.OrderedDict, and a torch memory snapshot holds only plain data"
    )
    assert loads(pickle.dumps(snapshot(block(1, [])))) == snapshot(block(1, []))  # tuples and dicts come back


def read_bytes(tmp_path: Path, data: bytes) -> Any:
    path = tmp_path / "s.pickle"
    path.write_bytes(data)
    return read(str(path))


def test_a_file_that_is_not_a_snapshot_is_one_line(tmp_path: Path) -> None:
    assert read(str(tmp_path / "gone.pickle")).error == (
        "the file is gone (the latest 20 are kept beside the study's database)"
    )
    assert (read_bytes(tmp_path, b"\x80\x04garbage").error or "").startswith("not a pickle (")
    assert read_bytes(tmp_path, pickle.dumps([1, 2])).error == "not a torch memory snapshot (no 'segments' list)"
    odd = snapshot(block(MiB, [{"filename": ["not", "a", "str"], "name": {}, "line": 1}]))
    assert read_bytes(tmp_path, pickle.dumps(odd)).error == (
        "not a torch memory snapshot (a frame's filename is list, not text)"
    )
    big = tmp_path / "big.pickle"
    big.write_bytes(pickle.dumps(snapshot(block(1, []))) + b"\0" * (2 * MiB))
    assert read(str(big), max_bytes=MiB).error == "2 MiB, over the 1 MiB read at most"


def test_a_snapshot_torch_builds_on_cpu_is_read_by_its_frames(tmp_path: Path) -> None:
    """torch.profiler's memory profile of a train step and a forward, turned into torch's snapshot format on CPU: the
    parameters (made before the profile) have no frames, AdamW's states come from torch/optim, the gradients from
    the backward, the kept forward's tensors from the modules."""
    from torch.cuda._memory_viz import _profile_to_snapshot

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    opt = torch.optim.AdamW(model.parameters())
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    with torch.profiler.profile(profile_memory=True, record_shapes=True, with_stack=True) as prof:
        x = torch.randn(32, 64)
        model(x).sum().backward()
        opt.step()
        kept = model(x)  # its graph keeps the ReLU's output alive
    assert kept.requires_grad
    got = read_bytes(tmp_path, pickle.dumps(_profile_to_snapshot(prof)))
    s = got.parts
    assert s is not None, got.error
    steps = 4 * len(list(model.parameters()))  # AdamW's step counter: one float32 scalar a parameter
    assert s.before_recording == params
    assert s.part(OPTIMIZER) == 2 * params + steps
    assert s.part(GRADIENTS) == params
    assert s.part(ACTIVATIONS) == 32 * 256 * 4 + 32 * 64 * 4  # the ReLU's output and the kept output
    assert s.part(PARAMETERS) == s.part(ZERO_BUFFERS) == s.part(GENERATION_CACHE) == 0
    assert s.unattributed == s.live - sum(n for _, n in s.parts) - s.before_recording
