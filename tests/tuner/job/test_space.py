import pytest

from trials.contract import Knobs
from tuner.errors import SpaceError
from tuner.job.space import config_key, default_space, load_space, space_from_dict


class Fixed:
    """Answers suggest_categorical with the first choice, recording what was asked."""

    def __init__(self, picks=None):
        self.picks = picks or {}
        self.asked = []

    def suggest_categorical(self, name, choices):
        self.asked.append(name)
        return self.picks.get(name, next(iter(choices)))


def test_default_space_is_valid_and_conditional():
    space = default_space()
    assert space.micro_batch_size == [1, 2, 4, 8, 16, 32]
    configs = list(space.configs())
    assert len(configs) == space.size() > 10
    assert len({config_key(k, 1, 1) for k in configs}) == len(configs)
    for k in configs:
        if k.zero_stage == 0:
            assert k.allgather_bucket_size is None and not k.overlap_comm and not k.offload_optimizer
    assert any(k.zero_stage == 2 and k.overlap_comm and k.offload_optimizer for k in configs)


def test_zero_knobs_are_only_suggested_for_zero_stage_1_and_up():
    space = default_space()
    t = Fixed({"zero_stage": 0})
    space.sample(t)
    assert "zero_stage" in t.asked and "overlap_comm" not in t.asked and "reduce_bucket_size" not in t.asked
    t = Fixed({"zero_stage": 2})
    knobs = space.sample(t)
    assert {"overlap_comm", "reduce_bucket_size", "allgather_bucket_size", "offload_optimizer"} <= set(t.asked)
    assert isinstance(knobs, Knobs)
    t = Fixed({"zero_stage": 3})
    space.sample(t)
    assert "allgather_bucket_size" not in t.asked and "reduce_bucket_size" in t.asked


def test_yaml_file_overrides_knob_by_knob(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("micro_batch_size: [2, 4]\nzero_stage: 2\nreduce_bucket_size: [5e8, '2e8']\n")
    space = load_space(p)
    assert space.micro_batch_size == [2, 4]
    assert space.zero_stage == [2]
    assert space.reduce_bucket_size == [500000000, 200000000]
    assert space.gradient_checkpointing == default_space().gradient_checkpointing


def test_bucket_sizes_as_a_range_with_5e7_ends(tmp_path):
    """A bucket range in YAML ("low: 1e7" is a string to YAML): it used to be read as the list of its keys."""
    p = tmp_path / "s.yaml"
    p.write_text("reduce_bucket_size: {low: 1e7, high: 5e7, scale: linear, step: 2e7}\nallgather_bucket_size: 5e7\n")
    space = load_space(p)
    assert space.reduce_bucket_size == [10**7, 3 * 10**7, 5 * 10**7]
    assert space.allgather_bucket_size == [5 * 10**7]
    assert load_space(_write(tmp_path, "reduce_bucket_size: {low: 1e7, high: 5e7}\n")).reduce_bucket_size == [
        2**24,
        2**25,
    ]


def _write(folder, text):
    p = folder / "t.yaml"
    p.write_text(text)
    return p


def test_toml_file_and_ranges(tmp_path):
    p = tmp_path / "s.toml"
    p.write_text("max_length = [64, 128]\n[micro_batch_size]\nlow = 4\nhigh = 20\nscale = 'linear'\nstep = 8\n")
    space = load_space(p)
    assert space.micro_batch_size == [4, 12, 20]
    assert space.max_length == [64, 128]


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ("micro_batchsize: [1]\n", "unknown knob 'micro_batchsize'"),
        ("micro_batch_size: []\n", "'micro_batch_size'"),
        ("micro_batch_size: [0, 2]\n", "'micro_batch_size'"),
        ("micro_batch_size: {low: 64, high: 8}\n", "above high"),
        ("micro_batch_size: {low: 5, high: 7}\n", "no power of two"),
        ("zero_stage: [0, 4]\n", "zero_stage"),
        ("overlap_comm: [maybe]\n", "'overlap_comm'"),
        ("max_length: ['long']\n", "'max_length'"),
        ("max_length: [99999999]\n", "max_length"),
        ("micro_batch_size: [1, 1]\n", "repeats"),
        ("precision: [fp8]\n", "'precision'"),
        ("micro_batch_size: {low: 1, high: 100, scale: linear}\n", "at most 64"),
        ("- 1\n- 2\n", "mapping"),
        ("micro_batch_size: [1\n", "not valid"),
    ],
)
def test_invalid_space_is_one_line_naming_the_key(tmp_path, body, needle):
    p = tmp_path / "bad.yaml"
    p.write_text(body)
    with pytest.raises(SpaceError) as err:
        load_space(p)
    msg = str(err.value)
    assert needle in msg
    assert "\n" not in msg


def test_missing_binary_or_directory_file(tmp_path):
    with pytest.raises(SpaceError, match="does not exist"):
        load_space("/no/such/space.yaml")
    with pytest.raises(SpaceError, match="is a directory"):
        load_space(tmp_path)
    binary = tmp_path / "b.yaml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(SpaceError, match="not UTF-8"):
        load_space(binary)


def test_torch_engine_without_zero(tmp_path):
    space = space_from_dict({"micro_batch_size": [1], "max_length": [8], "engine": ["torch"], "zero_stage": [0]})
    (k,) = list(space.configs())
    assert k.engine == "torch" and k.zero_stage == 0
    with pytest.raises(SpaceError, match="zero_stage"):
        space_from_dict({"micro_batch_size": [1], "max_length": [8], "engine": ["torch"], "zero_stage": [0, 2]})


def test_mixed_engines_skip_zero_for_torch():
    space = space_from_dict(
        {"micro_batch_size": [1], "max_length": [8], "engine": ["torch", "deepspeed"], "zero_stage": [0, 2]}
    )
    configs = list(space.configs())
    assert sum(k.engine == "torch" for k in configs) == 1
    assert all(k.zero_stage == 0 for k in configs if k.engine == "torch")


def test_config_key_depends_on_world_and_accumulation():
    k = Knobs(micro_batch_size=2, max_length=8)
    assert config_key(k, 1, 4) != config_key(k, 2, 2)
    assert config_key(k, 1, 4) == config_key(Knobs(micro_batch_size=2, max_length=8), 1, 4)


# -- issue 13: the space is counted, never enumerated, when it is checked ---------------------------------------------
def test_count_equals_the_enumerated_grid_for_conditional_spaces():
    from tuner.job.space import default_space

    base = default_space()
    variants = [
        {},
        {"engine": ["torch", "deepspeed"], "zero_stage": [0, 3]},
        {"engine": ["torch"], "zero_stage": [0]},
        {"zero_stage": [1, 3], "alloc_conf": [None, "expandable_segments:True"]},
        {"eval_batch_size": [None, 4, 8], "generate": [False, True], "precision": ["fp32", "bf16"]},
    ]
    for patch in variants:
        space = base.restrict(**patch)
        assert space.count() == len(list(space.configs())) == space.size(), patch


def test_a_huge_range_or_grid_is_refused_in_one_line_without_enumerating():
    import time

    from tuner.errors import LimitError
    from tuner.job.space import MAX_CONFIGS, IntRange, default_space, space_from_dict

    assert IntRange(low=1, high=10**18, scale="linear").count() == 10**18
    assert IntRange(low=3, high=64).count() == len(IntRange(low=3, high=64).values()) == 5  # 4 8 16 32 64
    base = default_space().model_dump()
    t0 = time.perf_counter()
    with pytest.raises(LimitError, match=r"knob 'micro_batch_size': the range 1\.\.10+ holds 10+ values"):
        space_from_dict({**base, "micro_batch_size": {"low": 1, "high": 10**18, "scale": "linear"}}, "space")
    grid = {"micro_batch_size": list(range(1, 65)), "max_length": list(range(1, 65)), "eval_batch_size": [None, 1, 2]}
    with pytest.raises(LimitError, match=rf"configs; at most {MAX_CONFIGS}"):
        space_from_dict({**base, **grid}, "space")
    assert time.perf_counter() - t0 < 5  # counted: 1e18 values or 4e7 configs listed would take hours, or all memory


def test_alloc_conf_is_checked_when_the_space_is_read():
    from tuner.errors import SpaceError
    from tuner.job.space import default_space, space_from_dict

    base = default_space().model_dump()
    with pytest.raises(SpaceError, match=r"alloc_conf.*'\[/\]' is not PyTorch allocator syntax"):
        space_from_dict({**base, "alloc_conf": ["[/]"]}, "space")
    ok = space_from_dict({**base, "alloc_conf": [None, "expandable_segments:True,max_split_size_mb:128"]}, "space")
    assert ok.alloc_conf[1] == "expandable_segments:True,max_split_size_mb:128"
