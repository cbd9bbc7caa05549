"""trials.engine.probe_deepspeed_config: the export's DeepSpeed JSON as a probe runs it, changed only where a probe
must run differently (its accumulation, no profiler files, CPU stand-ins for CUDA-only parts)."""

from __future__ import annotations

import pytest
import torch

from trials.engine import hidden_size, probe_deepspeed_config
from trials.optim import client_optimizer

USER = {
    "train_batch_size": 64,
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 8,
    "gradient_clipping": 0.5,
    "optimizer": {"type": "AdamW", "params": {"lr": 2e-5, "betas": [0.9, 0.99], "eps": 1e-8, "weight_decay": 0.01}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}},
    "bf16": {"enabled": True},
    "zero_optimization": {
        "stage": 3,
        "reduce_bucket_size": 1000,
        "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto",
        "sub_group_size": 10**8,
    },
    "flops_profiler": {"enabled": True, "output_file": "/home/user/profile.txt"},
    "wandb": {"enabled": True, "project": "theirs"},
    "steps_per_print": 10,
}


def run(user: dict, *, cuda: bool = False) -> dict:
    return probe_deepspeed_config(user, micro_batch_size=4, accum=2, world_size=2, cuda=cuda, hidden_size=64)


def test_only_how_a_probe_runs_changes() -> None:
    ds = run(USER)
    assert (ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"], ds["train_batch_size"]) == (
        4,
        2,
        16,
    )
    assert "flops_profiler" not in ds and "wandb" not in ds  # no files of theirs written, no run logged to their wandb
    assert ds["steps_per_print"] == 10**9
    # what the job computes stays: clipping, scheduler, precision, the optimizer's hyperparameters, their ZeRO keys
    assert ds["gradient_clipping"] == 0.5 and ds["scheduler"] == USER["scheduler"] and ds["bf16"] == {"enabled": True}
    assert {k: v for k, v in ds["optimizer"]["params"].items() if k != "torch_adam"} == USER["optimizer"]["params"]
    zero = ds["zero_optimization"]
    assert zero["sub_group_size"] == 10**8 and zero["reduce_bucket_size"] == 1000
    # model-sized "auto" as the HF Trainer resolves it from the hidden size
    assert (
        zero["stage3_prefetch_bucket_size"] == int(0.9 * 64 * 64) and zero["stage3_param_persistence_threshold"] == 640
    )
    assert USER["zero_optimization"]["stage3_prefetch_bucket_size"] == "auto"  # the input is not modified


def test_cpu_stand_ins_and_none_on_cuda() -> None:
    offload = {**USER, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True}}}
    cpu, gpu = run(USER), run(USER, cuda=True)
    assert cpu["optimizer"]["params"]["torch_adam"] is True  # FusedAdam is CUDA-only
    assert "torch_adam" not in gpu["optimizer"]["params"]  # on a GPU: the user's FusedAdam
    assert run(offload)["zero_optimization"]["offload_optimizer"]["pin_memory"] is False  # pinning needs CUDA
    assert run(offload, cuda=True)["zero_optimization"]["offload_optimizer"]["pin_memory"] is True
    assert "torch_adam" not in run(offload)["optimizer"]["params"]  # offloaded Adam is DeepSpeedCPUAdam on both


def test_no_optimizer_section_is_the_trainers_client_optimizer() -> None:
    ds = run({k: v for k, v in USER.items() if k != "optimizer"})
    assert "optimizer" not in ds and ds["zero_allow_untested_optimizer"] is True
    opt = client_optimizer([torch.nn.Parameter(torch.zeros(2))], 1e-3, cuda=False)
    assert isinstance(opt, torch.optim.AdamW) and not opt.defaults["fused"]


def test_an_auto_nothing_resolves_is_refused() -> None:
    with pytest.raises(ValueError, match=r"optimizer\.params\.lr as 'auto'"):
        run({**USER, "optimizer": {"type": "AdamW", "params": {"lr": "auto"}}})


def test_hidden_size_of_t5_and_llama_configs() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM, T5Config, T5ForConditionalGeneration

    t5 = T5ForConditionalGeneration(T5Config(d_model=32, d_ff=64, num_layers=1, num_heads=2, d_kv=16, vocab_size=64))
    llama = LlamaForCausalLM(
        LlamaConfig(hidden_size=48, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, vocab_size=64)
    )
    assert (hidden_size(t5), hidden_size(llama)) == (32, 48)
    with pytest.raises(ValueError, match="no hidden_size"):
        hidden_size(torch.nn.Linear(2, 2))


def test_a_probe_cause_names_the_error_behind_the_error() -> None:
    from trials.outcome import one_line

    try:
        try:
            raise OSError("ninja: build stopped: subcommand failed.")
        except OSError as e:
            raise RuntimeError("DeepSpeedCPUAdam requires the cpu_adam op, which failed to build/load.") from e
    except RuntimeError as exc:
        line = one_line(exc)
    assert line == (
        "RuntimeError: DeepSpeedCPUAdam requires the cpu_adam op, which failed to build/load. "
        "(caused by OSError: ninja: build stopped: subcommand failed.)"
    )


def test_pinned_parts_read_torchs_host_memory_stats() -> None:
    """The engine's pinned host allocations on CUDA (issue 30 §3), from torch.cuda.host_memory_stats' documented keys
    (the stats themselves need a GPU: a dict of that shape stands in)."""
    from trials.pinned import pinned_parts

    stats = {"host_alloc_time.total": 9_500_000, "allocated_bytes.peak": 12 * 2**30, "num_host_alloc": 40}
    assert pinned_parts(stats) == {"pinned_alloc": 9.5, "pinned_gib": 12.0}
    assert pinned_parts({}) == {}  # a torch that reports neither
