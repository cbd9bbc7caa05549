"""Every key of an accelerate config (accelerate 1.16's ClusterConfig, what `accelerate launch --config_file` reads)
and of its dynamo_config block, with what a probe does with it; its fsdp_config block is read key by key by
tuner.interop.baseline_fsdp (tuner.interop.fsdp_names); its deepspeed_config block (accelerate's DeepSpeed plugin)
key by key here (DEEPSPEED_PLUGIN_KEYS), then turned into a DeepSpeed config by tuner.interop.baseline_plugin.

``read_accelerate`` reads a config through the ledger: a refused key or value is a BaselineError of one line, a key
accelerate does not know is refused as accelerate refuses it ("unknown keys"), and the compile its dynamo_config asks
for is returned for the probe (accelerate compiles the prepared model with these options). Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tuner.errors import BaselineError
from tuner.interop.ds_json import nearest
from tuner.job.ledger import Entry, falsy, neutral, refused, run, unless

_LAUNCHER = "where and how the launcher starts the processes"
_TPU = "TPUs (not probed; unused on GPUs)"


#: the parallelism_config keys a probe runs: FSDP2's hybrid sharding (replicas x shards); TP / CP are not probed
HSDP_KEYS = frozenset({"parallelism_config_dp_replicate_size", "parallelism_config_dp_shard_size"})


def _hsdp_only(value: Any) -> str | None:
    """Refuses a parallelism_config asking for more than FSDP2's replicas x shards (tensor / context parallelism)."""
    if not value:
        return None
    if not isinstance(value, Mapping):
        return "parallelism_config must be a mapping of parallelism_config_* keys"
    others = sorted(k for k, v in value.items() if k not in HSDP_KEYS and v not in (None, 1, False))
    if others:
        return f"{', '.join(others)}: tensor / context parallelism is not probed yet"
    return None


ACCELERATE_KEYS: dict[str, Entry] = {
    "compute_environment": neutral(_LAUNCHER),
    "distributed_type": run("the engine: DEEPSPEED, FSDP, MULTI_GPU (DDP), NO"),
    "mixed_precision": run("the precision (held)"),
    "use_cpu": neutral(
        "CPU training", unless(falsy, "your job trains on the CPU: tuner probes accelerators"), "drop it"
    ),
    "debug": neutral(
        "accelerate's collective checks",
        unless(falsy, "accelerate's debug mode checks every collective's shapes (a sync per collective)"),
        "search with debug false",
    ),
    "num_processes": run("the world size (every probe runs this many ranks)"),
    "machine_rank": neutral(_LAUNCHER),
    "num_machines": run(
        "the node count: a search probes across as many nodes (--nnodes; tuner.interop.baseline_nodes)"
    ),
    "gpu_ids": neutral("which GPUs the launcher uses"),
    "main_process_ip": neutral(_LAUNCHER),
    "main_process_port": neutral(_LAUNCHER),
    "rdzv_backend": neutral(_LAUNCHER),
    "same_network": neutral(_LAUNCHER),
    "main_training_function": neutral("the function the launcher calls"),
    "enable_cpu_affinity": neutral("the host's CPU placement"),
    "fp8_config": neutral("FP8 training", unless(falsy, "FP8 (TransformerEngine / torchao) is not probed"), "drop it"),
    "deepspeed_config": run("your DeepSpeed settings (read as accelerate's DeepSpeed plugin turns them into a config)"),
    "fsdp_config": run("your FSDP2 settings"),
    "parallelism_config": run(
        "FSDP2's replicas x shards (HSDP: dp_replicate_size is trial 0's, searched across nodes)",
        _hsdp_only,
        "search data parallel: keep only parallelism_config_dp_replicate_size / dp_shard_size",
    ),
    "megatron_lm_config": neutral("Megatron-LM", unless(falsy, "Megatron-LM is not probed"), "drop it"),
    "mpirun_config": neutral(_LAUNCHER),
    "downcast_bf16": neutral(_TPU),
    "tpu_name": neutral(_TPU),
    "tpu_zone": neutral(_TPU),
    "tpu_use_cluster": neutral(_TPU),
    "tpu_use_sudo": neutral(_TPU),
    "command_file": neutral(_TPU),
    "commands": neutral(_TPU),
    "tpu_vm": neutral(_TPU),
    "tpu_env": neutral(_TPU),
    "dynamo_config": run("the model compiled as accelerate compiles it (backend, mode, fullgraph, dynamic)"),
    # accelerate's older spellings, converted by its process_config
    "fp16": run("accelerate's older spelling of mixed_precision fp16"),
    "dynamo_backend": run("accelerate's older spelling of dynamo_config.dynamo_backend"),
    "ipex_config": neutral("Intel's extension", unless(falsy, "IPEX is not probed"), "drop it"),
}

#: dynamo_config's keys (accelerate launch's --dynamo_* options): what accelerate's TorchDynamoPlugin compiles with
DYNAMO_KEYS: dict[str, Entry] = {
    "dynamo_backend": run("torch.compile's backend (NO: no compile)"),
    "dynamo_mode": run("torch.compile's mode"),
    "dynamo_use_fullgraph": run("torch.compile's fullgraph"),
    "dynamo_use_dynamic": run("torch.compile's dynamic shapes"),
    "dynamo_use_regional_compilation": neutral(
        "compiling repeated blocks alone",
        unless(falsy, "regional compilation is not probed yet"),
        "search with dynamo_use_regional_compilation false",
    ),
}


def _not_nvme(value: Any) -> bool:
    return str(value).lower() != "nvme"


_NVME = "offload to NVMe is not probed"
_NVME_FIX = "offload to cpu or none"

#: deepspeed_config's keys (accelerate launch's DeepSpeed arguments, what its launcher passes to the training process
#: as ACCELERATE_* variables): accelerate's DeepSpeedPlugin builds the DeepSpeed config from them
#: (tuner.interop.baseline_plugin), which the baseline reads as a DeepSpeed JSON
DEEPSPEED_PLUGIN_KEYS: dict[str, Entry] = {
    "deepspeed_config_file": refused(
        "the DeepSpeed JSON it names is read where your launcher runs, not by tuner",
        "give that JSON as the baseline (`tuner search --baseline ds_config.json --training-args args.json`)",
    ),
    "zero_stage": run("the ZeRO stage (trial 0's; the space may search others)"),
    "offload_optimizer_device": run(
        "optimizer offload to the CPU (the offload_optimizer knob)", unless(_not_nvme, _NVME), _NVME_FIX
    ),
    "offload_param_device": run(
        "ZeRO-3 parameter offload to the CPU (the offload_param knob)", unless(_not_nvme, _NVME), _NVME_FIX
    ),
    "offload_optimizer_nvme_path": neutral("where NVMe offload writes (read only with device nvme)"),
    "offload_param_nvme_path": neutral("where NVMe offload writes (read only with device nvme)"),
    "gradient_accumulation_steps": run("DeepSpeed's accumulation (auto: the training args')"),
    "gradient_clipping": run("DeepSpeed's gradient clipping (auto: the training args' max_grad_norm)"),
    "zero3_init_flag": run("ZeRO-3's model built partitioned under deepspeed.zero.Init, as the probe builds it"),
    "zero3_save_16bit_model": neutral("saving (stage3_gather_16bit_weights_on_model_save gathers at save only)"),
    "deepspeed_hostfile": neutral(_LAUNCHER),
    "deepspeed_exclusion_filter": neutral(_LAUNCHER),
    "deepspeed_inclusion_filter": neutral(_LAUNCHER),
    "deepspeed_multinode_launcher": neutral(_LAUNCHER),
    "deepspeed_moe_layer_cls_names": neutral(
        "ZeRO-3 leaf modules of a mixture of experts",
        unless(falsy, "ZeRO-3 MoE leaf modules are not probed"),
        "search without deepspeed_moe_layer_cls_names",
    ),
}


@dataclass(frozen=True)
class AccelerateHeld:
    """What the ledger read of an accelerate config: the compile it asks for (None: none), what it keeps unprobed."""

    compile: dict[str, Any] | None = None  # torch.compile's keywords, as accelerate's dynamo plugin passes them
    kept: dict[str, str] = field(default_factory=dict)


def checked(where: str, block: Mapping[str, Any], table: Mapping[str, Entry]) -> dict[str, str]:
    """Every key of ``block`` through ``table``; the neutral ones' reasons (a BaselineError for a refused one)."""
    kept: dict[str, str] = {}
    for key, value in block.items():
        entry = table.get(str(key))
        if entry is None:
            raise BaselineError(
                f"{where}{key} is not a key accelerate reads (accelerate launch refuses unknown keys)"
                f"{nearest(str(key), set(table))}; fix its spelling or remove it"
            )
        why = entry.refusal(value)
        if why is not None:
            fix = f": {entry.fix}" if entry.fix else ""
            raise BaselineError(f"{where}{key}={str(value)[:80]!r}: {why}{fix}")
        if entry.verdict == "neutral":
            kept[f"{where}{key}"] = entry.why
    return kept


def _compile(dynamo: Mapping[str, Any]) -> dict[str, Any] | None:
    """torch.compile's keywords from dynamo_config, as accelerate's TorchDynamoPlugin.to_kwargs gives them."""
    backend = str(dynamo.get("dynamo_backend") or "NO")
    if backend.upper() == "NO":
        return None
    options: dict[str, Any] = {"backend": backend.lower()}
    if dynamo.get("dynamo_mode"):
        options["mode"] = dynamo["dynamo_mode"]
    for key, name in (("dynamo_use_fullgraph", "fullgraph"), ("dynamo_use_dynamic", "dynamic")):
        if dynamo.get(key) is not None:
            options[name] = bool(dynamo[key])
    return options


def read_accelerate(config: Mapping[str, Any]) -> AccelerateHeld:
    """An accelerate config through the ledger (its fsdp_config / deepspeed_config blocks are read on their own)."""
    kept = checked("accelerate config ", config, ACCELERATE_KEYS)
    given = config.get("dynamo_config") or {}
    if not isinstance(given, Mapping):
        raise BaselineError("accelerate config dynamo_config must be a mapping of dynamo_* keys")
    dynamo = dict(given)
    if config.get("dynamo_backend") is not None:  # the older spelling, as process_config converts it
        dynamo.setdefault("dynamo_backend", config["dynamo_backend"])
    kept |= checked("accelerate config dynamo_config.", dynamo, DYNAMO_KEYS)
    block = config.get("deepspeed_config") or {}
    if config.get("distributed_type") == "DEEPSPEED":  # the plugin's keys (launcher's DeepSpeed arguments)
        if not isinstance(block, Mapping):
            raise BaselineError("accelerate config deepspeed_config must be a mapping of DeepSpeed plugin keys")
        kept |= checked("accelerate config deepspeed_config.", block, DEEPSPEED_PLUGIN_KEYS)
    return AccelerateHeld(_compile(dynamo), kept)
