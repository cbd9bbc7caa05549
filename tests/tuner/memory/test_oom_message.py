"""The OOM message's facts read back, fragmentation ruled in or out from them, and the failed size matched to the
traced allocation that reaches it at a length the data has."""

from __future__ import annotations

import pytest

from tuner.errors import ConfigError
from tuner.memory.oom_match import match_failed
from tuner.memory.oom_message import OomMessage, fragmentation, parse, read
from tuner.memory.trace import Trace, TracedAllocation, TracePoint

GiB = 1 << 30
SEED = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.81 GiB. GPU has a total capacity of "
    "79.15 GiB of which 2.86 GiB is free. ... 74.19 GiB is allocated by PyTorch, and 1.59 GiB is reserved by "
    "PyTorch but unallocated."
)


def test_the_seed_message_reads_back_every_fact():
    m = parse(SEED)
    assert m.failed == int(4.81 * GiB) and m.capacity == int(79.15 * GiB) and m.free == int(2.86 * GiB)
    assert m.allocated == int(74.19 * GiB) and m.reserved_unallocated == int(1.59 * GiB)
    assert m.lines()[0] == "tried to allocate 4.81 GiB"


def test_a_folded_message_and_a_file(tmp_path):
    folded = "CUDA out of memory. Tried to allocate\n 512.00 MiB. GPU 0 has a total capacity of 23.65 GiB"
    path = tmp_path / "oom.txt"
    path.write_text(folded)
    m = read(f"@{path}")
    assert m.failed == 512 * (1 << 20) and m.capacity == int(23.65 * GiB) and m.reserved_unallocated is None
    assert fragmentation(m)[0] is None


def test_not_an_oom_message_is_one_line_naming_the_fix(tmp_path):
    with pytest.raises(ConfigError, match="no 'Tried to allocate <size>'"):
        parse("RuntimeError: NCCL error")
    with pytest.raises(ConfigError, match="cannot read the --oom-message file"):
        read(f"@{tmp_path}/missing.txt")


def test_fragmentation_is_ruled_out_when_the_spare_memory_could_not_hold_the_block():
    ruled, why = fragmentation(parse(SEED))
    assert ruled is False and "1.59 GiB reserved-unallocated + 2.86 GiB free = 4.45 GiB < the 4.81 GiB" in why
    ruled, why = fragmentation(OomMessage(failed=2 * GiB, free=GiB // 2, reserved_unallocated=3 * GiB))
    assert ruled is True and "expandable_segments" in why


def _trace() -> Trace:
    """A trace at 640 tokens, micro batch 2: a quadratic softmax, a linear hidden state, a fixed weight copy."""
    softmax = TracedAllocation(op="softmax", shape=[2, 16, 640, 640], dtype="float32", nbytes=2 * 16 * 640 * 640 * 4)
    hidden = TracedAllocation(op="mm", shape=[2, 640, 2816], dtype="float32", nbytes=2 * 640 * 2816 * 4)
    weight = TracedAllocation(op="_to_copy", shape=[32128, 1024], dtype="bfloat16", nbytes=32128 * 1024 * 2)
    point = TracePoint(
        micro_batch_size=2, max_length=640, precision="bf16", largest={"forward_backward": [softmax, hidden, weight]}
    )
    return Trace(param_count=1, param_bytes=4, largest_param=1, points=[point])


def test_the_failed_size_is_solved_for_the_length_that_produces_it():
    failed = int(4.81 * GiB)
    found = match_failed(_trace(), failed, {"forward_backward": 2}, 9000, False, "bf16")
    assert [m.op for m in found] == ["softmax"]  # the hidden state would need 229k tokens: beyond the data
    m = found[0]
    assert m.shape == (2, 16, m.length, m.length) and abs(m.length - 6352) <= 2 and m.error <= 0.05
    text = m.describe()
    assert "4.81 GiB = the float32 attention matrix (softmax-sized, op softmax)" in text
    assert "of the train forward + backward, 2 x 16 x 6,35" in text
    assert match_failed(_trace(), failed, {"forward_backward": 2}, 6000, False, "bf16") == []  # data too short
    fixed = match_failed(_trace(), 32128 * 1024 * 2, {"forward_backward": 2}, 9000, False, "bf16")
    assert fixed[0].op == "_to_copy" and fixed[0].error == 0  # exact first; a length-dependent one reaches it too
