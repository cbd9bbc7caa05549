"""benchmarks/gpu_check.sh for real on this CPU host (DRY_RUN=1): the venv's site-packages stand in for the wheel kit;
the team's files (tests/data/seed) as the baseline on a tiny T5 on the emulated device go through `python -m tuner
search`, the probe table and the Seq2SeqTrainer run of the chosen config with its DeepSpeed export; the evidence
lands in $OUT."""

from __future__ import annotations

import os
import site
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.settings import load_settings

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_gpu_check_dry_run_passes_on_cpu(tmp_path: Path) -> None:
    settings = load_settings()
    env = {
        **os.environ,
        "DRY_RUN": "1",
        "KIT_SITE": site.getsitepackages()[0],
        "PYTHON": sys.executable,
        "GPU_CHECK_WORK": str(tmp_path),
        # the suite's op cache (scripts/test.sh exports TUNER_CACHE_DIR) for the script's probes and for its Trainer
        # run, which otherwise compiled DeepSpeed's shm comm again into torch's default ~/.cache/torch_extensions
        "TUNER_CACHE_DIR": str(settings.cache_dir),
        "TORCH_EXTENSIONS_DIR": str(settings.torch_extensions_dir),
    }
    proc = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh")],
        env={**env, "OUT": str(tmp_path / "out")},
        capture_output=True,
        text=True,
        timeout=900,
    )
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    assert "device: cpu (emulated device)" in out
    assert "probe 0 (baseline): micro 2 ZeRO-2 offload overlap:" in out  # the team's config is trial 0
    assert "fixed cost" in out and "peak allocated" in out and "device-used" in out and "need" in out
    # each op reported by `tuner prepare`, the engine's setup in parts, the estimate beside the measured phases
    assert "  cpu_adam: " in out and "  shm_comm: " in out
    assert "engine.initialize" in out and "memory_window" in out and "timed cycles, spread" in out
    assert "estimate / measured allocated: train " in out
    # the OOM probe explained from its record; the team's config at its worst batch; their OOM text read back
    assert (
        "== tuner explain --study gpu-check --trial 0" in out and "recorded failure, rank 0: tried to allocate" in out
    )
    assert "crash: trial 0 at the worst batch: oom, refused" in out
    assert "your OOM message: tried to allocate 4.81 GiB, capacity 79.15 GiB" in out
    assert "baseline: " in out and "pick: trial " in out
    assert "GPU CHECK PASS" in out and "OOM count 0" in out and "(deepspeed True)" in out
    assert "generate at 16 tokens" in out  # the Trainer's eval generated at the probed length, not transformers' 20
    # quiet: only the check's own lines (DeepSpeed's logger, tqdm and the search's table are in the log)
    assert not [line for line in out.splitlines() if line.startswith("[20") or "it/s]" in line]
    evidence = tmp_path / "out"
    assert {p.name for p in evidence.iterdir()} == {"gpu_check.log", "gpu-check.db", "trainer.json"}  # <= 8 files
    assert "trial   0" in (evidence / "gpu_check.log").read_text()
