"""The layout of a search across nodes (nodes x ranks from the options and Slurm's step), what it needs of its
storage, and its knobs across nodes: each sampled only where its engine reads it, each dividing the world."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from trials.contract import Knobs, ModelSpec, ProbeConfig
from tuner.errors import ConfigError, SpaceError
from tuner.job.nodes import check_storage, node_layout, node_space
from tuner.job.space import inline_space
from tuner.settings import SlurmStep, slurm_step

SLURM = {"SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "2", "SLURM_NODEID": "1", "SLURM_GPUS_ON_NODE": "8"}


def test_the_layout_is_nodes_times_ranks_from_the_options_or_the_slurm_step() -> None:
    assert node_layout(2, 4, None, None) == (2, 8)
    assert node_layout(2, None, 8, None) == (2, 8)
    assert node_layout(None, None, 4, None) == (1, 4)
    assert node_layout(None, 3, None, None) == (1, 3)
    step = slurm_step({**SLURM, "SLURM_STEP_NODELIST": "gpu[1-2]"})
    assert step == SlurmStep(nnodes=2, tasks=2, node_id=1, nodelist="gpu[1-2]", gpus_on_node=8)
    assert node_layout(None, None, None, step) == (2, 16)  # srun -N 2 --ntasks-per-node 1 on 8-GPU nodes
    assert node_layout(1, None, 8, step) == (1, 8)  # the options win
    assert slurm_step({"SLURM_NNODES": "2"}) is None  # a batch script's first node is no step across nodes


@pytest.mark.parametrize(
    ("nnodes", "nproc", "world", "slurm", "said"),
    [
        (2, None, None, None, "--nproc-per-node"),
        (2, 4, 6, None, "is not --nnodes 2 x --nproc-per-node 4"),
        (2, None, 5, None, "--nproc-per-node"),
        (None, None, None, {**SLURM, "SLURM_STEP_NUM_TASKS": "16"}, "srun -N 2 --ntasks-per-node 1"),
        (65, 1, None, None, "above 64"),
        (1, 2, 4, None, "--world-size 4 is not --nproc-per-node 2"),
    ],
)
def test_a_layout_that_does_not_add_up_is_one_line(nnodes, nproc, world, slurm, said) -> None:  # type: ignore[no-untyped-def]
    option = lambda name: "--" + name.replace("_", "-")  # noqa: E731
    with pytest.raises(ConfigError, match=said.replace("-", r"\-")):
        node_layout(nnodes, nproc, world, slurm_step(slurm) if slurm else None, option)


def test_sqlite_is_refused_for_more_than_one_node_in_one_line() -> None:
    with pytest.raises(ConfigError) as err:
        check_storage("sqlite:///tuner.db", 2)
    assert "PostgreSQL" in str(err.value) and "\n" not in str(err.value)
    check_storage("sqlite:///tuner.db", 1)
    check_storage("postgresql+psycopg://db/tuner", 2)


def test_across_nodes_the_space_gains_hpz_over_a_node_and_a_replica_per_node() -> None:
    space = inline_space({"engine": ["deepspeed", "fsdp2"], "zero_stage": [2, 3]})
    wide = node_space(space, 8, 2)
    assert wide.zero_hpz_partition_size == [None, 4] and wide.dp_replicate_size == [None, 2]
    assert node_space(space, 8, 1) == space  # one node: nothing across nodes
    listed = node_space(
        inline_space({"zero_stage": [3], "zero_hpz_partition_size": [2]}), 8, 2, {"zero_hpz_partition_size"}
    )
    assert listed.zero_hpz_partition_size == [2]  # the user's choices stay
    with pytest.raises(SpaceError, match="does not divide the world size 8"):
        node_space(inline_space({"zero_stage": [3], "zero_hpz_partition_size": [3]}), 8, 2, {"zero_hpz_partition_size"})


def test_each_knob_across_nodes_is_sampled_only_where_its_engine_reads_it() -> None:
    space = node_space(inline_space({"engine": ["deepspeed", "fsdp2"], "zero_stage": [2, 3]}), 4, 2)
    configs = list(space.configs())
    assert len(configs) == space.count()
    for k in configs:
        if k.zero_hpz_partition_size:
            assert k.engine == "deepspeed" and k.zero_stage == 3
        if k.dp_replicate_size:
            assert k.engine == "fsdp2"
    assert {k.zero_hpz_partition_size for k in configs if k.zero_stage == 3} == {None, 2}
    assert {k.dp_replicate_size for k in configs if k.engine == "fsdp2"} == {None, 2}
    assert "zero_hpz_partition_size" not in inline_space({"zero_stage": [3]}).model_dump()  # one node: old JSON


def test_the_knobs_across_nodes_belong_to_their_engine_and_leave_other_dumps_alone() -> None:
    with pytest.raises(ValidationError, match="ZeRO\\+\\+ knobs of ZeRO-3"):
        Knobs(micro_batch_size=1, max_length=8, zero_stage=2, zero_hpz_partition_size=2)
    with pytest.raises(ValidationError, match="FSDP2 knob"):
        Knobs(micro_batch_size=1, max_length=8, zero_stage=3, dp_replicate_size=2)
    plain = Knobs(micro_batch_size=1, max_length=8, zero_stage=3)
    assert not {"zero_hpz_partition_size", "zero_quantized_weights", "dp_replicate_size"} & set(plain.model_dump())
    hpz = Knobs(micro_batch_size=1, max_length=8, zero_stage=3, zero_hpz_partition_size=2, zero_quantized_weights=True)
    assert hpz.engine_label == "ZeRO-3 (hpZ 2, qwZ)" and hpz.model_dump()["zero_hpz_partition_size"] == 2
    hsdp = Knobs(micro_batch_size=1, max_length=8, engine="fsdp2", dp_replicate_size=2)
    assert hsdp.engine_label == "FSDP2 resharded, HSDP x2"


def test_a_probe_config_is_whole_nodes_and_its_knobs_divide_the_world() -> None:
    k = Knobs(micro_batch_size=1, max_length=8, engine="fsdp2", dp_replicate_size=2)
    config = ProbeConfig(model=ModelSpec(), knobs=k, world_size=4, nnodes=2)
    assert config.nproc_per_node == 2 and config.model_dump()["nnodes"] == 2
    assert "nnodes" not in ProbeConfig(knobs=Knobs(micro_batch_size=1, max_length=8)).model_dump()
    with pytest.raises(ValidationError, match="not 2 nodes of equal ranks"):
        ProbeConfig(knobs=Knobs(micro_batch_size=1, max_length=8), world_size=3, nnodes=2)
    with pytest.raises(ValidationError, match="does not divide the world size 3"):
        ProbeConfig(knobs=k, world_size=3)
