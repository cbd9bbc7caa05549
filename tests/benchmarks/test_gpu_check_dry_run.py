"""benchmarks/gpu_check.sh for real on this CPU host (DRY_RUN=1): the venv's site-packages stand in for the wheel kit;
a tiny T5 on the emulated device goes through `python -m tuner search`, the probe table and the Seq2SeqTrainer run of
the chosen config with its DeepSpeed export."""

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
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh")], env=env, capture_output=True, text=True, timeout=600
    )
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    assert "device: cpu (emulated device)" in out
    assert "fixed cost" in out and "peak reserved" in out and "device-used peak" in out
    assert "GPU CHECK PASS:" in out and "OOM count 0" in out
    assert "(deepspeed True)" in out
