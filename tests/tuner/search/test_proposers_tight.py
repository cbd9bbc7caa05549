"""The opening when memory is tight: the plainest setting does not fit even at its smallest micro batch, so the opening
walks to the feasible corner by the memory-saving move of most memory freed per throughput lost, tests it at its
smallest micro batch and bisects upwards there (pure, no Optuna, no probes)."""

import json
import random

from trials.contract import Knobs
from tuner.job.space import space_from_dict
from tuner.records import ProbeRow
from tuner.search import proposers
from tuner.search.evidence import Evidence
from tuner.search.schedule import Schedule

MiB = 2**20
SPACE = {
    "micro_batch_size": [1, 2, 4, 8, 16],
    "max_length": [64, 128],
    "zero_stage": [0, 1, 2],
    "reduce_bucket_size": [2_000_000, 8_000_000],
    "offload_optimizer": [False, True],
    "gradient_checkpointing": [False, True],
}


def context(world_size=2, space=SPACE):
    return proposers.Context(
        space=space_from_dict(space),
        world_size=world_size,
        global_batch=16,
        headroom=0.9,
        device_memory=100 * MiB,
        schedule=Schedule(),
        rng=random.Random(0),
    )


def config(ctx, micro=1, **knobs):
    """The plainest config of the space at ``micro``, with ``knobs`` changed (ZeRO >= 1: the smallest bucket)."""
    base = ctx.space.sample(proposers.PlainSuggester(micro)).model_dump()
    base.update(knobs)
    if base["zero_stage"] >= 1 and base["reduce_bucket_size"] is None:
        base["reduce_bucket_size"] = min(SPACE["reduce_bucket_size"])
    matches = [k for k in ctx.grid if k.model_dump() == {**k.model_dump(), **base}]
    assert matches, base
    return matches[0]


def row(ctx, knobs: Knobs, status="ok", stable=True):
    return ProbeRow.from_record(
        {
            "result": {},  # a measured ok row has its result (ProbeRow's invariant)
            "config_key": ctx.key(knobs),
            "fidelity": "short",
            "knobs": knobs.model_dump(mode="json"),
            "config": {},
            "status": status,
            "stable": stable and status == "ok",
            "objective": float(knobs.micro_batch_size) if status == "ok" else None,
            "samples_per_s": float(knobs.micro_batch_size) if status == "ok" else None,
            "peak_allocated": 10 * MiB if status == "ok" else None,
            "capacity": 100 * MiB,
        }
    )


def evidence(ctx, *rows):
    ev = Evidence(device_memory=100 * MiB)
    ev.load(list(rows))
    return ev


def setting_of(knobs):
    return proposers._setting(knobs)


def changed(setting: str, start: str) -> dict:
    a, b = json.loads(start), json.loads(setting)
    return {n: b[n] for n in a if a[n] != b[n]}


def test_relief_moves_rank_memory_freed_per_throughput_lost():
    ctx = context(world_size=2)
    settings = proposers._settings(ctx.grid)
    start = setting_of(config(ctx))
    moves = [changed(m, start) for m in proposers.relief_moves(start, settings, world_size=2)]
    # a shorter length first (little cost per token), checkpointing (frees most), then the ZeRO stages; offload needs
    # ZeRO >= 1, so it is no single move from stage 0; larger buckets save nothing and are no move
    assert moves[0] == {"max_length": 64}
    assert moves[1] == {"gradient_checkpointing": True}
    assert {m["zero_stage"] for m in moves[2:]} == {1, 2}
    assert all(set(m) <= {"zero_stage", "reduce_bucket_size"} for m in moves[2:])
    assert all(m.get("reduce_bucket_size") in (None, 2_000_000) for m in moves[2:])
    # from ZeRO-1, offloading the optimizer is one move
    at_one = setting_of(config(ctx, zero_stage=1))
    assert {"offload_optimizer": True} in [changed(m, at_one) for m in proposers.relief_moves(at_one, settings, 2)]


def test_relief_moves_on_one_rank_never_raise_the_zero_stage():
    ctx = context(world_size=1)
    settings = proposers._settings(ctx.grid)
    start = setting_of(config(ctx))
    moves = [changed(m, start) for m in proposers.relief_moves(start, settings, world_size=1)]
    assert moves == [{"max_length": 64}, {"gradient_checkpointing": True}]


def test_opening_bisects_the_plainest_setting_first():
    ctx = context()
    first = proposers.opening(ctx, evidence(ctx))
    assert first.knobs is not None and first.knobs == config(ctx, micro=4) and not first.done


def test_opening_walks_to_the_feasible_corner_when_the_plainest_setting_never_fits():
    ctx = context()
    plain_ooms = [row(ctx, config(ctx, micro=m), status="oom") for m in (4, 1)]  # micro 1 OOMs: nothing fits there
    step = proposers.opening(ctx, evidence(ctx, *plain_ooms))
    assert step.knobs == config(ctx, micro=1, max_length=64) and not step.done  # the best relief, smallest micro
    # that OOMs too: the next relief (checkpointing), again at its smallest micro batch
    short_oom = row(ctx, config(ctx, micro=1, max_length=64), status="oom")
    step = proposers.opening(ctx, evidence(ctx, *plain_ooms, short_oom))
    assert step.knobs == config(ctx, micro=1, gradient_checkpointing=True)
    # it fits: bisect the micro batch upwards inside that setting (the lower middle of 2, 4, 8, 16: memory is tight)
    ckpt_fits = row(ctx, config(ctx, micro=1, gradient_checkpointing=True))
    step = proposers.opening(ctx, evidence(ctx, *plain_ooms, short_oom, ckpt_fits))
    assert step.knobs == config(ctx, micro=4, gradient_checkpointing=True)
    # once every micro batch of the feasible setting is settled, the opening hands over to the guide
    settled = [row(ctx, config(ctx, micro=m, gradient_checkpointing=True)) for m in (2, 4, 8, 16)]
    assert proposers.opening(ctx, evidence(ctx, *plain_ooms, short_oom, ckpt_fits, *settled)).done


def test_opening_goes_two_moves_deep_when_every_single_move_fails():
    ctx = context()
    settings = proposers._settings(ctx.grid)
    start = setting_of(config(ctx))
    failed = [row(ctx, config(ctx, micro=1), status="oom")]
    for move in proposers.relief_moves(start, settings, world_size=2):
        failed.append(row(ctx, settings[move][0], status="oom"))
    step = proposers.opening(ctx, evidence(ctx, *failed))
    assert step.knobs is not None and step.knobs.micro_batch_size == 1
    # from the best-ranked single move (the shorter length), one more move
    assert step.knobs.max_length == 64 and len(changed(setting_of(step.knobs), start)) == 2


def test_an_over_headroom_probe_counts_as_not_fitting():
    ctx = context()
    over = [row(ctx, config(ctx, micro=m), stable=False) for m in (1,)]
    oom = [row(ctx, config(ctx, micro=4), status="oom")]
    step = proposers.opening(ctx, evidence(ctx, *over, *oom))
    assert step.knobs == config(ctx, micro=1, max_length=64)


def test_opening_is_done_when_nothing_relieves_enough():
    space = {"micro_batch_size": [1, 2], "max_length": [128], "zero_stage": [0], "gradient_checkpointing": [False]}
    ctx = context(world_size=1, space=space)
    ev = evidence(ctx, row(ctx, ctx.grid[0], status="oom"))
    assert proposers.opening(ctx, ev).done
