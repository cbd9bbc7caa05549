"""ZeRO-3 builds the model as the Trainer does: transformers applies deepspeed.zero.Init itself (an HfDeepSpeedConfig
kept alive with the model), so its weight init never indexes an already-partitioned parameter (issue 23, defect 1:
the bare zero.Init around from_config raised IndexError in _init_weights' ``weight[padding_idx]`` for every
Llama-shaped model with a pad token). On CPU, in a real one-rank gloo group, with a real DeepSpeed ZeRO-3 engine step:
the Llama preset and a saved local Llama checkpoint."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tuner.probing.environment import probe_env

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent(
    """
    import os, sys
    import torch
    from trials.contract import ModelSpec, ProbeConfig, free_port
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    from trials.engine import build_engine, probe_deepspeed_config
    from trials.models import build_dtype, build_model, load_config
    from trials.data import worst_case_batch

    saved = sys.argv[1]
    build_model(ModelSpec(source="builtin:tiny-llama")).save_pretrained(saved)
    for source in ("builtin:tiny-llama", saved):
        cfg = ProbeConfig.model_validate({
            "model": {"source": source},
            "knobs": {"micro_batch_size": 2, "max_length": 16, "zero_stage": 3, "precision": "bf16"},
            "deepspeed": {"bf16": {"enabled": True}, "zero_optimization": {"stage": 3}},
        })
        ds = probe_deepspeed_config(cfg.deepspeed, micro_batch_size=2, accum=1, world_size=1, cuda=False,
                                    hidden_size=load_config(cfg.model).hidden_size)
        model = build_model(cfg.model, where="zero-init", zero_config=ds, dtype=build_dtype(cfg.knobs, "zero-init"))
        params = list(model.parameters())
        assert all(hasattr(p, "ds_id") for p in params), "not partitioned by zero.Init"
        assert {p.dtype for p in params} == {torch.bfloat16}, {p.dtype for p in params}
        engine = build_engine(model, cfg, 1, torch.device("cpu"), 1)
        batch = worst_case_batch(2, 16, 512, seed=0, encoder_decoder=False, device=torch.device("cpu"))
        engine.micro_step(batch)
        print("built", source, len(params))
    """
)


def test_zero3_builds_llama_through_transformers_zero_init(tmp_path: Path) -> None:
    env = probe_env(1)
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "llama")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("built ")] == [
        "builtin:tiny-llama",
        str(tmp_path / "llama"),
    ], proc.stdout
