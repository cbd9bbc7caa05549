"""Exports of a pick measured across nodes: read back by the tools themselves. accelerate's own config loader and
launcher see the machines and the c10d rendezvous (and an HSDP pick's parallelism config, whose mesh the training
process's Accelerator builds from the launcher's environment); DeepSpeed's ZeRO config takes the ZeRO++ keys; the
launch lines start every node with torchrun / accelerate / srun, never ssh."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from tuner.interop.export import render
from tuner.interop.export.nodes import MAIN_PLACEHOLDER

ZERO3 = {"micro_batch_size": 2, "max_length": 64, "engine": "deepspeed", "zero_stage": 3}
HSDP = {"micro_batch_size": 2, "max_length": 64, "engine": "fsdp2", "dp_replicate_size": 2}


def launched(config_file: Path, *extra: str) -> argparse.Namespace:
    """What `accelerate launch --config_file FILE ... train.py` resolves before it starts torchrun (its own parser,
    validation and multi-GPU environment)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    args = launch_command_parser().parse_args(["--config_file", str(config_file), *extra, "train.py"])
    args, _, _ = _validate_launch_command(args)
    args.env = prepare_multi_gpu_env(args)
    return args


@pytest.mark.parametrize("knobs", [ZERO3, HSDP], ids=["zero3", "hsdp"])
def test_accelerate_reads_two_machines_on_the_c10d_rendezvous(tmp_path: Path, knobs: dict[str, object]) -> None:
    from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file

    text = render("accelerate", knobs, world_size=4, gradient_accumulation_steps=2, nnodes=2)
    assert "--machine_rank NODE_RANK --main_process_ip FIRST_NODE" in text  # the header says how each node starts
    path = tmp_path / "accelerate.yaml"
    path.write_text(text)
    loaded = load_config_from_file(str(path))
    assert isinstance(loaded, ClusterConfig)
    assert (loaded.num_machines, loaded.num_processes, loaded.rdzv_backend) == (2, 4, "c10d")
    assert loaded.main_process_ip == MAIN_PLACEHOLDER and loaded.same_network is False
    if knobs["engine"] == "fsdp2":  # the DeepSpeed launcher path needs its JSON: the FSDP2 one launches here
        # the line `tuner best --format launch` gives each node (accelerate launch takes rdzv_backend from its flag)
        args = launched(path, "--machine_rank", "1", "--main_process_ip", "10.1.2.3", "--rdzv_backend", "c10d")
        assert (args.nnodes, args.nproc_per_node, args.rdzv_endpoint) == ("2", "2", "10.1.2.3:29500")
        assert args.rdzv_backend == "c10d" and args.node_rank == 1
        assert args.env["PARALLELISM_CONFIG_DP_REPLICATE_SIZE"] == "2"
        assert args.env["PARALLELISM_CONFIG_DP_SHARD_SIZE"] == "2"


def test_an_hsdp_pick_builds_its_mesh_in_the_training_process_from_the_environment(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from accelerate.parallelism_config import ParallelismConfig

    text = render("env", HSDP, world_size=4, gradient_accumulation_steps=2, nnodes=2)
    env = dict(line.removeprefix("export ").split("=", 1) for line in text.splitlines())
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    parallelism = ParallelismConfig()  # what the Trainer's Accelerator builds under a bare torchrun
    assert (parallelism.dp_replicate_size, parallelism.dp_shard_size) == (2, 2)
    assert parallelism.fsdp_dim_names == ["dp_replicate", "dp_shard_cp"]  # HSDP: replicate x shard
    assert env["TUNER_NNODES"] == "2"


def test_one_machine_exports_stay_as_they_were() -> None:
    config = yaml.safe_load(
        render("accelerate", HSDP | {"dp_replicate_size": None}, world_size=2, gradient_accumulation_steps=2)
    )
    assert config["num_machines"] == 1 and config["rdzv_backend"] == "static" and "parallelism_config" not in config


def test_the_deepspeed_json_of_a_zero_pp_pick_carries_its_keys_and_deepspeed_takes_them() -> None:
    import json

    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    knobs = ZERO3 | {"zero_hpz_partition_size": 2, "zero_quantized_gradients": True, "reduce_bucket_size": 1000}
    ds = json.loads(render("deepspeed", knobs, world_size=4, gradient_accumulation_steps=2, nnodes=2))
    zero = ds["zero_optimization"]
    assert zero["zero_hpz_partition_size"] == 2 and zero["zero_quantized_gradients"] is True
    assert "zero_quantized_weights" not in zero  # left off: DeepSpeed's default, what the probe ran
    assert ds["train_batch_size"] == 2 * 2 * 4  # the world of every node
    parsed = DeepSpeedZeroConfig(**zero)
    assert parsed.zero_hpz_partition_size == 2 and parsed.zero_quantized_gradients
    plain = json.loads(render("deepspeed", ZERO3, world_size=4, gradient_accumulation_steps=2))["zero_optimization"]
    assert not {"zero_hpz_partition_size", "zero_quantized_weights", "zero_quantized_gradients"} & set(plain)


def test_the_launch_lines_start_every_node_on_its_own() -> None:
    text = render("launch", ZERO3, world_size=4, gradient_accumulation_steps=2, nnodes=2, study="s")
    assert "torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint" in text
    assert "srun -N 2 --ntasks-per-node 1" in text and "--machine_rank" in text and "--rdzv_backend c10d" in text
    assert "--deepspeed ds_config.json" in text and "tuner best --study s --format deepspeed" in text
    commands = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert not [line for line in commands if line.split()[0] in ("ssh", "pdsh", "deepspeed")]
    one = render("launch", ZERO3, world_size=2, gradient_accumulation_steps=2)
    assert "torchrun --standalone --nproc-per-node 2" in one
    hsdp = render("launch", HSDP, world_size=4, gradient_accumulation_steps=2, nnodes=2)
    assert "export PARALLELISM_CONFIG_DP_REPLICATE_SIZE=2" in hsdp and "--format accelerate" in hsdp
