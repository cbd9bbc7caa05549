"""The memory trace kept per model shape and versions (issue 40 §2): a second identical `tuner estimate` reads every
point from the cache (nothing traced: its stderr says so) and prints the same estimate; a corrupt or oversized cache
entry is a miss, traced again, never a crash."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TUNER = [sys.executable, "-c", "from tuner.cli import main; main()"]
ESTIMATE = ["estimate", "--model", "builtin:tiny-t5", "--micro-batch-size", "8", "--json"]


def _estimate(cache: Path) -> tuple[dict, str]:
    env = {**os.environ, "TUNER_CACHE_DIR": str(cache)}
    done = subprocess.run([*TUNER, *ESTIMATE], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)
    body.pop("traced")  # how it was traced: the one line that differs
    return body, done.stderr


def test_a_second_estimate_reads_the_trace_cache_and_a_corrupt_entry_is_traced_again(tmp_path):
    cache = tmp_path / "cache"
    first, said = _estimate(cache)
    assert "cached" not in said and "2 point(s) on CPU fake tensors" in said
    entries = sorted((cache / "traces").glob("*.json"))
    assert len(entries) == 3  # the two points and the model's numbers

    second, said = _estimate(cache)
    assert second == first
    assert f"tracing builtin:tiny-t5: 2 of 2 point(s) cached ({cache / 'traces'})" in said
    assert "starting the tracer" not in said  # nothing traced

    points = [p for p in entries if json.loads(p.read_text())["point"] is not None]
    points[0].write_text('{"key": "torn')  # a torn write: that point traced again, the other read
    third, said = _estimate(cache)
    assert third == first
    assert "1 of 2 point(s) cached" in said and "1 point(s) on CPU fake tensors" in said
    assert json.loads(points[0].read_text())["point"] is not None  # and kept again


def test_an_entry_that_is_too_large_foreign_or_not_its_own_is_a_miss(tmp_path):
    from tuner.memory.trace_cache import TraceCache

    cache = TraceCache(tmp_path)
    cache.write("k1", {"param_count": 1}, {"micro_batch_size": 1})
    assert cache.read("k1") == {"key": "k1", "model": {"param_count": 1}, "point": {"micro_batch_size": 1}}
    (tmp_path / "k2.json").write_bytes(b" " * (5 << 20))
    (tmp_path / "k3.json").write_text(json.dumps({"key": "k1", "model": {}, "point": None}))  # another key's
    (tmp_path / "k4.json").write_text("[1, 2]")
    assert [cache.read(k) for k in ("k2", "k3", "k4", "k5")] == [None, None, None, None]


def test_the_points_are_dealt_to_tracers_side_by_side_and_merged_back_in_order():
    from tuner.memory.trace_run import _merge, split

    point = {"micro_batch_size": 2, "max_length": 64, "gradient_checkpointing": False, "precision": "fp32"}
    points = [{**point, "max_length": n} for n in (64, 128, 256)]
    fsdp = [{**point, "world_size": 2, "reshard_after_forward": True}]
    request = {"model": {"source": "builtin:tiny-t5"}, "points": points, "fsdp_points": fsdp, "evaluation": None}
    parts = split(request, 2)
    assert len(parts) == 2 and sorted(i for _, where in parts for i in where) == [0, 1, 2, 3]
    assert all(sub["model"] == request["model"] for sub, _ in parts)
    assert split(request, 1) == [(request, [0, 1, 2, 3])]
    outs = [
        {
            "param_count": 7,
            "points": [{"n": i} for i in where if i < 3],
            "fsdp_points": [{"n": i} for i in where if i >= 3],
        }
        for _, where in parts
    ]
    merged = _merge(request, parts, outs)
    assert merged["param_count"] == 7
    assert merged["points"] == [{"n": 0}, {"n": 1}, {"n": 2}] and merged["fsdp_points"] == [{"n": 3}]


def test_explains_points_are_dealt_by_what_they_trace_not_their_tokens():
    """Explain's four points of a job that evaluates with generate (two lengths, checkpointing off and on; eval traced
    on the uncheckpointed ones): a fake-tensor trace costs per op, so each tracer gets one eval point and one
    checkpointed point, whatever their lengths (dealt by tokens, one got the 640-token eval point alone)."""
    from tuner.memory.trace_run import split

    point = {"micro_batch_size": 2, "precision": "bf16", "cast_module": True}
    points = [
        {**point, "max_length": n, "gradient_checkpointing": ckpt, **({"evaluate": False} if ckpt else {})}
        for n in (320, 640)
        for ckpt in (False, True)
    ]
    evaluation = {"eval_batch_size": 1, "generate": True, "generation_max_length": 61, "num_beams": 1}
    parts = split({"model": {}, "points": points, "evaluation": evaluation, "label_length": 61}, 2)
    dealt = sorted(sorted(where) for _, where in parts)
    assert dealt == [[0, 3], [1, 2]]  # eval 320 + checkpointed 640, checkpointed 320 + eval 640
    assert [sub.get("model_wide", True) for sub, _ in parts] == [True, False]  # the model-wide numbers traced once
