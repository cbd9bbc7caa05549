"""tuner.interop.fsdp_names against the installed accelerate and transformers: the keys each reads, the defaults each
runs when a key is left out, and the behaviour behind each refusal (what raises, what is dropped without a word)."""

from __future__ import annotations

import inspect
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tuner.interop.fsdp_names import (
    ACCELERATE_DEFAULTS,
    ACCELERATE_KNOWN,
    KEY,
    TRAINER_DEFAULTS,
    TRAINER_KNOWN,
    WRAP_POLICIES,
)


def launcher_env(block: dict[str, Any], tmp_path: Path) -> dict[str, str]:
    """The environment `accelerate launch` derives from an FSDP config with ``block``."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    path = tmp_path / "accelerate.yaml"
    path.write_text(yaml.safe_dump({"distributed_type": "FSDP", "num_processes": 2, "fsdp_config": block}))
    args, _, _ = _validate_launch_command(launch_command_parser().parse_args(["--config_file", str(path), "t.py"]))
    return {k: v for k, v in prepare_multi_gpu_env(args).items() if k.startswith(("FSDP_", "ACCELERATE_"))}


def launched_plugin(block: dict[str, Any], tmp_path: Path, mp: pytest.MonkeyPatch) -> tuple[dict[str, str], Any]:
    """The launcher's environment for ``block``, and the plugin the training process builds from it."""
    from accelerate.utils import FullyShardedDataParallelPlugin

    env = launcher_env(block, tmp_path)
    for key in [k for k in os.environ if k.startswith(("FSDP_", "ACCELERATE_"))]:
        mp.delenv(key)
    for key, value in env.items():
        mp.setenv(key, value)
    return env, FullyShardedDataParallelPlugin()


def test_the_accelerate_keys_are_the_launchers() -> None:
    from accelerate.commands.launch import launch_command_parser

    parser = launch_command_parser()
    group = next(g for g in parser._action_groups if g.title == "FSDP Arguments")
    read = {action.dest for action in group._group_actions}
    # fsdp_ignored_modules: read from the config with getattr (accelerate.utils.launch.prepare_multi_gpu_env)
    assert read | {"fsdp_ignored_modules"} == ACCELERATE_KNOWN


def test_the_trainer_keys_are_the_ones_training_arguments_reads() -> None:
    from transformers import TrainingArguments

    source = inspect.getsource(TrainingArguments._process_fsdp_args)
    source += inspect.getsource(TrainingArguments._apply_legacy_fsdp_to_config)
    read = set(re.findall(r"(?<!xla_)fsdp_config(?:\.get\(|\.setdefault\(|\[)\"(\w+)\"", source))
    assert read | {"sharding_strategy"} == TRAINER_KNOWN  # sharding_strategy: not read, refused with its fix


def test_accelerate_defaults_are_what_the_launcher_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.distributed.fsdp import CPUOffloadPolicy

    env, plugin = launched_plugin({"fsdp_version": 2}, tmp_path, monkeypatch)
    d = ACCELERATE_DEFAULTS
    assert plugin.reshard_after_forward is d["reshard_after_forward"]
    assert isinstance(plugin.cpu_offload, CPUOffloadPolicy) is d["offload_params"]
    assert plugin.activation_checkpointing is d["gradient_checkpointing"]
    assert plugin.auto_wrap_policy is None and d["auto_wrap_policy"] == "NO_WRAP"
    assert plugin.state_dict_type.name == d["state_dict_type"]
    assert plugin.cpu_ram_efficient_loading is d["cpu_ram_efficient_loading"]
    assert env[KEY["min_num_params"].env] == str(d["min_num_params"])
    assert launcher_env({}, tmp_path)["FSDP_VERSION"] == str(d["version"])  # no fsdp_version: FSDP1


def test_trainer_defaults_are_what_training_arguments_run(tmp_path: Path) -> None:
    from accelerate.utils import FullyShardedDataParallelPlugin
    from transformers import TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, fsdp=True)
    given = args.fsdp_plugin_args
    d = TRAINER_DEFAULTS
    assert given["fsdp_version"] == d["version"] and given["auto_wrap_policy"] == d["auto_wrap_policy"]
    assert given["reshard_after_forward"] is d["reshard_after_forward"] and "cpu_offload" not in given
    assert given["state_dict_type"] == d["state_dict_type"]
    assert given["cpu_ram_efficient_loading"] is d["cpu_ram_efficient_loading"]
    assert args.fsdp_config["min_num_params"] == d["min_num_params"]
    plugin = FullyShardedDataParallelPlugin(**given)
    assert plugin.activation_checkpointing is d["gradient_checkpointing"]


def test_the_refused_keys_raise_in_the_plugin_and_vanish_in_the_launcher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from accelerate.commands.config.cluster import FSDP_AUTO_WRAP_POLICY
    from accelerate.utils import FullyShardedDataParallelPlugin

    assert tuple(FSDP_AUTO_WRAP_POLICY) == WRAP_POLICIES
    with pytest.raises(ValueError, match="forward_prefetch is not yet implemented in FSDP2"):
        FullyShardedDataParallelPlugin(fsdp_version=2, forward_prefetch=True)
    with pytest.raises(ValueError, match="not supported with FSDP2"):
        FullyShardedDataParallelPlugin(fsdp_version=2, reshard_after_forward=2)
    # through the launcher the same keys are dropped without a word: the user would believe they run
    _, plugin = launched_plugin(
        {"fsdp_version": 2, "fsdp_forward_prefetch": True, "fsdp_sharding_strategy": "SHARD_GRAD_OP"},
        tmp_path,
        monkeypatch,
    )
    assert plugin.forward_prefetch is None and plugin.reshard_after_forward is True
