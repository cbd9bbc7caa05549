"""`tuner explain` prescribes (issue 40 §3): its changes cover the knobs the search varies for the config's engine,
on the user's engine and files, each with the `tuner search` line that probes it; sizes in the unit their magnitude
takes (MiB under a GiB); "your data's longest" only with data.

- The seed team's ZeRO-2 files on a tiny T5 whose device is too small for their 2e8-element buckets (two with
  overlap_comm: 763 MiB of ZeRO buffers): smaller buckets fit, and explain says so (the search had found it, explain
  said "no single change fits").
- An FSDP2 baseline (an accelerate YAML) on a tiny Llama: explained as FSDP2, in MiB, its changes' searches keep the
  baseline (and so the engine: no space file names one)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

SEED = Path(__file__).resolve().parents[2] / "data" / "seed"
TUNER = [sys.executable, "-c", "from tuner.cli import main; main()"]
ACCELERATE = """compute_environment: LOCAL_MACHINE
distributed_type: FSDP
mixed_precision: 'no'
num_processes: 2
fsdp_config:
  fsdp_version: 2
  fsdp_reshard_after_forward: true
  fsdp_offload_params: false
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer
  fsdp_state_dict_type: FULL_STATE_DICT
"""


def _explain(tmp_path: Path, *args: str) -> str:
    env = {**os.environ, "TUNER_CACHE_DIR": str(tmp_path / "cache")}
    cmd = [*TUNER, "explain", *args, "--storage", f"sqlite:///{tmp_path}/t.db"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _changes(out: str) -> list[tuple[str, str]]:
    """Each numbered change with the command under it."""
    lines = out.splitlines()
    return [(line, lines[n + 1]) for n, line in enumerate(lines) if re.match(r"  [0-9]+\. ", line)]


def test_a_zero2_oom_of_its_buckets_is_told_the_smaller_buckets_that_fit(tmp_path):
    seed = ["--baseline", str(SEED / "ds_config.json"), "--training-args", str(SEED / "training_args.json")]
    out = _explain(
        tmp_path,
        "--model",
        "builtin:tiny-t5",
        *seed,
        "--transformers-version",
        "4.57.3",  # their training args carry overwrite_output_dir: a 4.x release's
        "--world-size",
        "4",
        "--max-length",
        "128",
        "--device-memory",
        "500MiB",
    )
    assert "config: micro 2, ZeRO-2, offload, bf16; device memory 500.00 MiB a rank" in out
    assert "mostly ZeRO buffers (763.00 MiB)" in out and "> 500.00 MiB" in out
    assert "peak by phase and part, MiB" in out and " GiB" not in out  # MiB under a GiB, never "0.74 GiB"
    assert "your data's longest" not in out and "(every sample at max_length: no --dataset given)" in out
    changes = _changes(out)
    buckets = next((c for c in changes if "smaller ZeRO buckets" in c[0]), None)
    assert buckets is not None, out
    assert "reduce_bucket_size 5e7, allgather_bucket_size 5e7 (was reduce_bucket_size 2e8" in buckets[0]
    peak = re.search(r"peak ([0-9.]+) MiB", buckets[0])
    assert peak is not None and float(peak.group(1)) * 1.1 <= 500
    command = buckets[1]
    assert "printf 'zero_stage: [2], reduce_bucket_size: [50000000], allgather_bucket_size: [50000000]" in command
    assert f"--baseline {SEED / 'ds_config.json'} --training-args {SEED / 'training_args.json'}" in command
    assert "--transformers-version 4.57.3" in command and "--world-size 4" in command
    assert command.endswith("--space space.yaml")
    assert any("overlap_comm off" in what for what, _ in changes), out
    assert "no single change fits" not in out


def test_an_fsdp2_oom_is_explained_as_fsdp2_in_mib_with_searches_that_keep_the_baseline(tmp_path):
    acc = tmp_path / "accelerate.yaml"
    acc.write_text(ACCELERATE)
    args = tmp_path / "args.json"
    args.write_text('{"per_device_train_batch_size": 8, "output_dir": "out"}')
    out = _explain(
        tmp_path,
        "--model",
        "builtin:tiny-llama",
        "--baseline",
        str(acc),
        "--training-args",
        str(args),
        "--world-size",
        "2",
        "--max-length",
        "256",
        "--device-memory",
        "20MiB",
    )
    assert "config: micro 8, FSDP2 resharded, fp32; device memory 20.00 MiB a rank" in out
    assert "peak by phase and part, MiB" in out and " GiB" not in out
    assert re.search(r"crosses the device memory: [0-9.]+ MiB > 20.00 MiB", out)
    changes = _changes(out)
    assert any("micro batch 4, 2 accumulation steps (global batch kept)" in what for what, _ in changes), out
    assert any(what.split(". ", 1)[1].startswith("gradient checkpointing") for what, _ in changes), out
    for _, command in changes:  # on their engine: their accelerate file is the baseline, no space names an engine
        assert f"--baseline {acc} --training-args {args}" in command and "engine" not in command
