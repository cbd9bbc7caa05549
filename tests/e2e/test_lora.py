"""A LoRA job through the real entry point: `tuner search --lora-r ...` on builtin:tiny-llama, real probes with the
adapters, the memory estimate against their measured need, and exports that say the job was held fixed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trials.contract import LoraSpec

TUNER = str(Path(sys.executable).with_name("tuner"))
SPACE = "micro_batch_size: [2, 4]\nzero_stage: [0]\ngradient_checkpointing: [false]\n"


def tuner(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([TUNER, *args], capture_output=True, text=True, timeout=300, env=env, check=False)


def test_a_bad_lora_flag_is_one_line_and_exit_2() -> None:
    done = tuner("search", "--budget", "1m", "--model", "builtin:tiny-llama", "--lora-r", "0")
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "--lora-r 0 must be at least 1" in done.stderr


@pytest.mark.slow
def test_a_lora_search_probes_the_adapters_estimates_them_and_exports_no_lora(tmp_path: Path) -> None:
    import tuner as tuner_api
    from tuner.storage import Store

    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    url = f"sqlite:///{tmp_path}/tuner.db"
    done = tuner(
        "search",
        *("--model", "builtin:tiny-llama", "--space", str(space), "--storage", url, "--study", "lora"),
        *("--lora-r", "4", "--lora-alpha", "16", "--lora-target-modules", "q_proj,v_proj"),
        *("--budget", "5m", "--n-trials", "2", "--finalists", "0", "--device-memory", "160MiB", "--estimate"),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    held = "LoRA r 4 alpha 16 on q_proj,v_proj (adapters train, base frozen)"
    assert f"your job (held fixed): fp32, length 128, no eval step, {held}" in done.stdout
    # 5m: --n-trials ends the search after two probes (~25 s here); the budget only bounds the trace (20% of it) and
    # the probes' timeouts, which a loaded machine must not reach
    assert "memory estimate traced" in done.stdout, done.stdout[-2000:]

    spec = LoraSpec(r=4, alpha=16, target_modules=("q_proj", "v_proj"))
    rows = [r for r in Store(url).probes("lora") if r.measured]
    assert len(rows) == 2 and all(str(r.status) == "ok" for r in rows), done.stdout
    assert all(LoraSpec.model_validate(r.config["job"]["lora"]) == spec for r in rows)  # every probe ran them
    # the estimate made before each probe (grads and AdamW states for the 1,792 adapter params only) against its
    # measured need. The first is uncalibrated: it read 10.6% high at micro 4 while the fake trace built attention
    # masks the real all-ones batch never makes (issue 25); now within 1% (measured -0.001%). Calibrated on that
    # probe, the next one is within 1% too.
    first, second = (r.estimate_bytes / r.memory_need - 1 for r in rows if r.estimate_bytes and r.memory_need)
    assert abs(first) < 0.01 and abs(second) < 0.01, (first, second)

    best = tuner_api.best_config("lora", storage=url, format="json")  # what `tuner best --changes` / --format print
    fixed = next(line for line in best.changes if line.startswith("held fixed (your job): "))
    assert fixed.startswith(f"held fixed (your job): fp32, length 128, no eval step, {held}")
    assert fixed.endswith("no export sets the adapters: your script builds them (peft), as every probe did")
    summary = best.as_dict()
    assert summary["held_fixed"] == {"lora": spec.model_dump(mode="json")}
    assert "lora" not in json.dumps(summary["deepspeed"]).lower() and "lora" not in json.dumps(summary["hf"]).lower()
