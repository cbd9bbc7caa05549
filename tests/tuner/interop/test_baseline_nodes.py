"""The user's accelerate config across machines: a two-machine config is probed across two nodes (one line
otherwise), and its HSDP replicate degree is trial 0's."""

from __future__ import annotations

import pytest

from trials.contract import Knobs
from tuner.errors import BaselineError
from tuner.interop.baseline_nodes import check_machines, with_replicas


def test_a_config_across_machines_is_probed_across_as_many_nodes() -> None:
    check_machines({"num_machines": 2}, 2)
    check_machines({"num_machines": 1}, 2)  # searched across nodes on purpose: the export names them
    check_machines(None, 1)
    with pytest.raises(BaselineError, match="runs on num_machines 2; probe it across as many nodes"):
        check_machines({"num_machines": 2}, 1)
    with pytest.raises(BaselineError, match="whole number"):
        check_machines({"num_machines": "two"}, 2)


def test_trial_0_runs_the_replicas_of_their_parallelism_config() -> None:
    fsdp = Knobs(micro_batch_size=2, max_length=8, engine="fsdp2")
    given = {"parallelism_config": {"parallelism_config_dp_replicate_size": 2, "parallelism_config_dp_shard_size": 4}}
    assert with_replicas(fsdp, given, 8).dp_replicate_size == 2  # type: ignore[union-attr]
    assert with_replicas(fsdp, {}, 8) == fsdp
    zero = Knobs(micro_batch_size=2, max_length=8, zero_stage=3)
    assert with_replicas(zero, given, 8) == zero  # HSDP is FSDP2's
    four = {"parallelism_config": {"parallelism_config_dp_replicate_size": 4}}
    with pytest.raises(BaselineError, match="does not divide the world size 6"):
        with_replicas(fsdp, four, 6)
