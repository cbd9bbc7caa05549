"""FSDP2 in the search's pure parts: the space samples its knobs only for engine fsdp2, a knob dump of another engine
leaves them out (stored keys of earlier configs hold), the frontier orders them, the guide's featurizer sees them in a
mixed space, and the progress line names them briefly."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from trials.contract import Knobs
from tuner.cli.progress import compact
from tuner.job.space import config_key, inline_space, knobs_key
from tuner.memory.frontier import needs_at_least, normalize
from tuner.search.regression import Featurizer

MIXED = {
    "engine": ["deepspeed", "fsdp2"],
    "zero_stage": [0, 3],
    "micro_batch_size": [1, 2],
    "reshard_after_forward": [True, False],
    "offload_params": [False, True],
}


def test_fsdp_knobs_are_sampled_for_fsdp2_only() -> None:
    space = inline_space(MIXED)
    configs = list(space.configs())
    assert len(configs) == space.count()
    fsdp = [k for k in configs if k.engine == "fsdp2"]
    deepspeed = [k for k in configs if k.engine == "deepspeed"]
    assert {(k.reshard_after_forward, k.offload_params) for k in fsdp} == {
        (True, False),
        (False, False),
        (True, True),
        (False, True),
    }
    assert all(k.reshard_after_forward and not k.offload_params for k in deepspeed)
    assert all(k.zero_stage == 0 and k.reduce_bucket_size is None for k in fsdp)


def test_dumps_of_other_engines_keep_their_keys() -> None:
    ds = Knobs(micro_batch_size=2, max_length=64, zero_stage=2)
    assert "reshard_after_forward" not in ds.model_dump(mode="json")
    # the key of a DeepSpeed config is the one stored before FSDP2 existed (its dump is unchanged)
    assert knobs_key(ds) == knobs_key(Knobs.model_validate_json(ds.model_dump_json()))
    fsdp = Knobs(micro_batch_size=2, max_length=64, engine="fsdp2", reshard_after_forward=False)
    assert fsdp.model_dump()["reshard_after_forward"] is False
    assert config_key(fsdp, 2, 1) != config_key(fsdp.model_copy(update={"reshard_after_forward": True}), 2, 1)


@pytest.mark.parametrize(
    "bad",
    [
        {"engine": "fsdp2", "zero_stage": 3},
        {"engine": "fsdp2", "offload_optimizer": True, "zero_stage": 0},
        {"engine": "fsdp2", "reduce_bucket_size": 1000},
        {"engine": "deepspeed", "offload_params": True},
        {"engine": "torch", "reshard_after_forward": False},
    ],
)
def test_knobs_of_the_other_engine_are_refused(bad: dict) -> None:
    with pytest.raises(ValidationError):
        Knobs(micro_batch_size=1, max_length=8, **bad)


def test_frontier_orders_the_fsdp_knobs() -> None:
    base = {"micro_batch_size": 4, "max_length": 64, "engine": "fsdp2"}
    kept = normalize({**base, "reshard_after_forward": False})
    resharded = normalize(base)
    offload = normalize({**base, "offload_params": True})
    assert needs_at_least(kept, resharded) and not needs_at_least(resharded, kept)
    assert needs_at_least(resharded, offload) and not needs_at_least(offload, resharded)
    assert not needs_at_least(normalize({"micro_batch_size": 8, "max_length": 64}), resharded)  # engines apart


def test_featurizer_sees_fsdp_knobs_in_a_mixed_space() -> None:
    configs = list(inline_space(MIXED).configs())
    deepspeed_first = sorted(configs, key=lambda k: k.engine)  # the first dump lacks the FSDP knobs
    featurize = Featurizer(deepspeed_first)
    assert {"reshard_after_forward", "offload_params", "engine"} <= set(featurize.levels)
    a = Knobs(micro_batch_size=2, max_length=128, engine="fsdp2")
    b = a.model_copy(update={"reshard_after_forward": False})
    assert list(featurize(a)) != list(featurize(b))


def test_progress_names_fsdp_configs_briefly() -> None:
    knobs = {"micro_batch_size": 4, "max_length": 128, "engine": "fsdp2", "reshard_after_forward": False}
    assert compact({**knobs, "offload_params": True}) == "micro=4 len=128 fsdp2 no-reshard offload-params"
    assert compact({**knobs, "reshard_after_forward": True}) == "micro=4 len=128 fsdp2"


def test_the_files_engine_is_the_engine_searched_unless_the_space_names_engines() -> None:
    from tuner.job.definition import hold_engine

    space = inline_space(None)
    fsdp2 = hold_engine(space, "fsdp2")
    assert fsdp2.engine == ["fsdp2"] and fsdp2.reshard_after_forward == [False, True]
    assert fsdp2.offload_params == [False, True]  # FSDP2's own knobs searched
    assert hold_engine(space, "fsdp2", {"engine"}) is space  # a space file naming engines wins
    assert hold_engine(space, "deepspeed").engine == ["deepspeed"]
    torch = hold_engine(space, "torch")
    assert torch.engine == ["torch"] and torch.zero_stage == [0]
    assert hold_engine(space, None) is space  # no files: the space's engines
