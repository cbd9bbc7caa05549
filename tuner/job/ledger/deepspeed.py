"""Every top-level key of a DeepSpeed JSON (DeepSpeed 0.19: what ``DeepSpeedConfig`` and ``deepspeed.initialize``
read), with what a probe does with it. A probe runs the user's JSON through ``deepspeed.initialize`` itself
(trials.engine.probe_deepspeed_config changes only the batch fields, host sections and CPU-only adaptations), so most
keys are **run** by construction; the host sections are **neutral** (a probe must not write their profiles or log to
their runs: dropped in the probe, kept in the export); what DeepSpeed would run but a probe cannot run as their job
runs it (pipeline or tensor parallelism, elastic batches, data-efficiency curricula that change the lengths, an
enabled compression or sparse attention ...) is **refused** in one line. The ZeRO block's keys are checked against
DeepSpeedZeroConfig by tuner.interop.ds_json. tests/tuner/job/test_ledger.py records the keys the installed
DeepSpeed reads and fails on one without a verdict. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tuner.errors import BaselineError
from tuner.job.ledger import Entry, neutral, run, unless

_HOST = "acts on the host (profiles, monitors, logs): dropped in a probe, kept in your export"
_LOG = "logging"
_RUN = "deepspeed.initialize runs it as written"


def _off(value: Any) -> bool:
    """A section that asks for nothing: absent, false, empty, or ``enabled: false``."""
    if value in (None, False, {}, [], 0, ""):
        return True
    return isinstance(value, Mapping) and value.get("enabled", True) in (False, None)


def _section(why: str, fix: str) -> Entry:
    """A section a probe cannot run as their job runs it, unless it is switched off."""
    return neutral("switched off", unless(_off, why), fix)


DEEPSPEED_KEYS: dict[str, Entry] = {
    "train_batch_size": run("the global batch (held; tuned through micro batch x accumulation)"),
    "train_micro_batch_size_per_gpu": run("the micro batch (searched)"),
    "gradient_accumulation_steps": run("derived: global batch / (micro batch x world size)"),
    "zero_optimization": run("the ZeRO stage, buckets, overlap, offload (searched; the rest as written)"),
    "zero_allow_untested_optimizer": run(_RUN),
    "zero_force_ds_cpu_optimizer": run(_RUN),
    "optimizer": run("DeepSpeed's optimizer (their TrainingArguments' optim is not read beside it)"),
    "scheduler": run("built by deepspeed.initialize (their Trainer's fill of 'auto' checked by DeepSpeed first)"),
    "gradient_clipping": run(_RUN),
    "fp16": run("the precision (held)"),
    "bf16": run("the precision (held)"),
    "bfloat16": run("DeepSpeed's older spelling of bf16"),
    "torch_autocast": run(_RUN),
    "data_types": run(_RUN),
    "communication_data_type": run(_RUN),
    "seq_parallel_communication_data_type": run(_RUN),
    "prescale_gradients": run(_RUN),
    "gradient_predivide_factor": run(_RUN),
    "gradient_allreduce_op": run(_RUN),
    "sparse_gradients": run(_RUN),
    "disable_allgather": run(_RUN),
    "managed_gradient_accumulation": run(_RUN),
    "graph_harvesting": run(_RUN),
    "disable_python_gc": run(_RUN),
    "use_data_before_expert_parallelism": run(_RUN),
    "expert_parallel": run(_RUN),
    "vocabulary_size": run(_RUN),
    "dataloader_drop_last": neutral("their data loader (the probe's batches are built in advance)"),
    "steps_per_print": neutral(_LOG),
    "wall_clock_breakdown": neutral(_LOG + " (a sync per timed section)"),
    "memory_breakdown": neutral(_LOG),
    "dump_state": neutral(_LOG),
    "log_level": neutral(_LOG),
    "timers": neutral(_LOG),
    "tensorboard": neutral(_HOST),
    "wandb": neutral(_HOST),
    "csv_monitor": neutral(_HOST),
    "comet": neutral(_HOST),
    "comms_logger": neutral(_HOST),
    "flops_profiler": neutral(_HOST),
    "autotuning": neutral(_HOST),
    "monitor_config": neutral(_HOST),
    "checkpoint": neutral("saving (between steps)"),
    "nebula": neutral("saving (between steps)"),
    "datastates_ckpt": neutral("saving (between steps)"),
    "activation_checkpointing": neutral("read only by models that call deepspeed.checkpointing (HF models do not)"),
    "aio": neutral("NVMe offload's I/O (NVMe offload is refused in zero_optimization)"),
    "amp": _section("apex AMP is not probed", "use bf16 or fp16 blocks instead"),
    "pipeline": neutral("read only by a PipelineModule's engine (the HF Trainer never builds one)"),
    "tensor_parallel": neutral(
        "AutoTP's settings",
        unless(
            lambda v: not isinstance(v, Mapping) or v.get("autotp_size") in (None, 0, 1),
            "tensor parallelism (AutoTP, autotp_size > 1) is not probed",
        ),
        "search data parallel (autotp_size 1)",
    ),
    "elasticity": _section("elastic training changes the batch size at run time", "switch elasticity off"),
    "curriculum_learning": _section(
        "a curriculum changes the sequence lengths during training", "search at your final lengths without it"
    ),
    "data_efficiency": _section(
        "data efficiency (curriculum, token dropping) changes what a step computes", "switch it off for the search"
    ),
    "compression_training": _section("compression training is not probed", "switch it off for the search"),
    "sparse_attention": _section("DeepSpeed's sparse attention is not probed", "switch it off for the search"),
    "progressive_layer_drop": _section("progressive layer drop is not probed", "switch it off for the search"),
    "eigenvalue": _section("eigenvalue computation is not probed", "switch it off for the search"),
    "quantize_training": _section("quantized training is not probed", "switch it off for the search"),
    "weight_quantization": _section("weight quantization is not probed", "switch it off for the search"),
    "hybrid_engine": _section("the RLHF hybrid engine is not probed", "switch it off for the search"),
    "compile": _section(
        "DeepSpeed's compile section is not probed", "compile through your Trainer (torch_compile) instead"
    ),
}


def read_deepspeed(ds: Mapping[str, Any]) -> dict[str, str]:
    """The top-level keys of a DeepSpeed JSON through the ledger: a BaselineError (one line) for a refused one; the
    neutral ones kept with why. Keys DeepSpeed does not read are left to tuner.interop.ds_json (a near miss of a
    known key is a typo refused there; any other DeepSpeed ignores, as the probe does)."""
    kept: dict[str, str] = {}
    for key, value in ds.items():
        entry = DEEPSPEED_KEYS.get(str(key))
        if entry is None:
            continue
        why = entry.refusal(value)
        if why is not None:
            raise BaselineError(f"DeepSpeed {key}: {why}: {entry.fix}")
        if entry.verdict == "neutral" and not _off(value):
            kept[f"deepspeed {key}"] = entry.why
    return kept
