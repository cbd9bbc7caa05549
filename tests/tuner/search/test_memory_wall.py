"""Past the memory wall (tuner.search.memory_wall): after the opening, the incumbent's next micro batch up does not
fit; two measured peaks of its setting say whether model states or activations fill the memory, and the next micro
batch up is tried in the settings that free that kind, the cheapest in throughput first; the incumbent's setting is
climbed while its next micro batch up is unsettled, and a relief that fits without outranking the incumbent gets its
next micro batch up once (pure, no Optuna, no probes)."""

import dataclasses
import json

from tests.tuner.search.test_proposers_tight import MiB, config, context, evidence
from trials.contract import Knobs
from tuner.records import ProbeRow
from tuner.search import memory_wall, proposers


def peak_row(ctx, knobs: Knobs, peak_mib: float | None, stable=True) -> ProbeRow:
    """A measured probe: finished with ``peak_mib`` (stable or above the headroom), or an OOM (None)."""
    ok = peak_mib is not None
    return ProbeRow.from_record(
        {
            "result": {},  # a measured ok row has its result (ProbeRow's invariant)
            "config_key": ctx.key(knobs),
            "fidelity": "short",
            "knobs": knobs.model_dump(mode="json"),
            "config": {},
            "status": "ok" if ok else "oom",
            "stable": ok and stable,
            "objective": float(knobs.micro_batch_size) if ok else None,
            "samples_per_s": float(knobs.micro_batch_size) if ok else None,
            "peak_allocated": int(peak_mib * MiB) if ok else 100 * MiB,
            "capacity": 100 * MiB,
        }
    )


def setting(knobs: dict) -> str:
    return proposers._setting(Knobs.model_validate(knobs))


def setting_of_knobs(knobs: Knobs) -> str:
    return proposers._setting(knobs)


def moved(ctx, knobs: Knobs, start: Knobs) -> dict:
    a, b = json.loads(proposers._setting(start)), json.loads(proposers._setting(knobs))
    return {n: b[n] for n in a if a[n] != b[n] and n != "reduce_bucket_size"}


def test_two_peaks_split_memory_into_fixed_and_per_sample():
    ctx = context()
    rows = [peak_row(ctx, config(ctx, micro=m), p) for m, p in ((1, 70), (2, 74), (4, 82))]
    rows.append(peak_row(ctx, config(ctx, micro=8), None))  # an OOM says nothing about the split
    where = proposers._setting(config(ctx, micro=1))
    found = memory_wall.split(rows, setting, where)
    assert found is not None
    assert found.per_sample == 4 * MiB and found.fixed == 66 * MiB  # from the two largest: micro 2 and 4
    assert memory_wall.binding_knobs(found, 90 * MiB) == memory_wall.MODEL_STATE_KNOBS
    assert memory_wall.binding_knobs(memory_wall.Split(fixed=20 * MiB, per_sample=10 * MiB), 90 * MiB) == (
        memory_wall.ACTIVATION_KNOBS
    )
    assert memory_wall.split(rows[:1], setting, where) is None


def test_model_states_fill_memory_so_zero_and_offload_come_first():
    ctx = context()
    # the incumbent: checkpointing at micro 2 (fixed 80 MiB of the 90 MiB line: model states); micro 4 is over
    home = dict(gradient_checkpointing=True)
    rows = [peak_row(ctx, config(ctx, micro=1, **home), 80), peak_row(ctx, config(ctx, micro=2, **home), 81)]
    rows.append(peak_row(ctx, config(ctx, micro=4, **home), 93, stable=False))
    step = proposers.past_wall(ctx, evidence(ctx, *rows))
    start = config(ctx, micro=2, **home)
    assert step.knobs is not None and step.knobs.micro_batch_size == 4 and not step.done
    assert moved(ctx, step.knobs, start) == {"zero_stage": 1}  # the cheapest model-state move
    # it does not fit: the next cheapest, still at micro 4 and never a checkpointing or length move
    rows.append(peak_row(ctx, step.knobs, None))
    step = proposers.past_wall(ctx, evidence(ctx, *rows))
    assert step.knobs is not None and step.knobs.micro_batch_size == 4
    assert moved(ctx, step.knobs, start) == {"zero_stage": 2}
    rows.append(peak_row(ctx, step.knobs, None))
    step = proposers.past_wall(ctx, evidence(ctx, *rows))
    assert moved(ctx, step.knobs, start) == {"zero_stage": 1, "offload_optimizer": True}
    # that fits and outranks the old incumbent: its setting is climbed (micro 8 there), until its own wall
    passed = step.knobs
    rows.append(peak_row(ctx, passed, 60))
    step = proposers.past_wall(ctx, evidence(ctx, *rows))
    assert step.knobs is not None and step.knobs.micro_batch_size == 8 and moved(ctx, step.knobs, passed) == {}
    # micro 8 OOMs there and one peak of that setting is no split: the guide takes over
    rows.append(peak_row(ctx, step.knobs, None))
    assert proposers.past_wall(ctx, evidence(ctx, *rows)).done


def test_offload_at_a_lower_zero_stage_is_a_model_state_move_where_it_frees_memory_on_net():
    ctx = context(world_size=2)
    home = dict(zero_stage=2, gradient_checkpointing=True)
    rows = [peak_row(ctx, config(ctx, micro=m, **home), p) for m, p in ((1, 80), (2, 81))]  # model states fill it
    rows.append(peak_row(ctx, config(ctx, micro=4, **home), None))
    start = config(ctx, micro=2, **home)
    step = proposers.past_wall(ctx, evidence(ctx, *rows))
    # offload at stage 1 costs less than offload at stage 2 and frees more (0.3) than one stage (0.3 x 1/2) by the
    # prior: it comes first; offload at stage 0 does not exist in this space
    assert step.knobs is not None and step.knobs.micro_batch_size == 4
    assert moved(ctx, step.knobs, start) == {"zero_stage": 1, "offload_optimizer": True}
    rows.append(peak_row(ctx, step.knobs, None))
    step = proposers.past_wall(ctx, evidence(ctx, *rows))
    assert step.knobs is not None and moved(ctx, step.knobs, start) == {"offload_optimizer": True}
    here, there = json.loads(setting_of_knobs(start)), json.loads(setting_of_knobs(step.knobs))
    # on one rank a stage frees nothing, so any stage down with offload on frees on net; never without offload
    relief = proposers.RELIEF
    stage_one = {**there, "zero_stage": 1}
    assert memory_wall.trades_stage_for_offload(here, stage_one, memory_wall.MODEL_STATE_KNOBS, relief, 1)
    assert not memory_wall.trades_stage_for_offload(
        here, {**here, "zero_stage": 1}, memory_wall.MODEL_STATE_KNOBS, relief, 2
    )
    # three stages down at 2 ranks (0.45 freed) outweigh offload (0.3): not a relief
    high = {**here, "zero_stage": 3}
    assert not memory_wall.trades_stage_for_offload(
        high, {**there, "zero_stage": 0}, memory_wall.MODEL_STATE_KNOBS, relief, 2
    )
    # activations fill memory: never a model-state trade
    assert not memory_wall.trades_stage_for_offload(here, stage_one, memory_wall.ACTIVATION_KNOBS, relief, 1)


def test_activations_fill_memory_so_checkpointing_or_a_shorter_length():
    ctx = context()
    rows = [peak_row(ctx, config(ctx, micro=m), p) for m, p in ((1, 30), (2, 50))]  # 20 MiB per sample
    rows.append(peak_row(ctx, config(ctx, micro=4), None))
    step = proposers.past_wall(ctx, evidence(ctx, *rows))
    assert step.knobs is not None and step.knobs.micro_batch_size == 4
    assert moved(ctx, step.knobs, config(ctx, micro=2)) == {"max_length": 64}  # the cheapest activation move


def test_no_wall_no_split_no_move():
    ctx = context()
    # the next micro batch up was never probed: no wall yet, the incumbent's setting is climbed
    rows = [peak_row(ctx, config(ctx, micro=m), p) for m, p in ((1, 30), (2, 50))]
    assert proposers.past_wall(ctx, evidence(ctx, *rows)).knobs == config(ctx, micro=4)
    # it fits without outranking the incumbent: no wall, nothing to do
    rows.append(dataclasses.replace(peak_row(ctx, config(ctx, micro=4), 70), objective=1.0, samples_per_s=1.0))
    assert proposers.past_wall(ctx, evidence(ctx, *rows)).done
    # one peak: no split
    one = [peak_row(ctx, config(ctx, micro=2), 50), peak_row(ctx, config(ctx, micro=4), None)]
    assert proposers.past_wall(ctx, evidence(ctx, *one)).done
    # nothing measured: nothing to do
    assert proposers.past_wall(ctx, evidence(ctx)).done


def test_a_relief_that_fits_but_does_not_outrank_the_incumbent_gets_its_next_micro_batch_up_once():
    ctx = context()
    rows = [peak_row(ctx, config(ctx, micro=m), p) for m, p in ((1, 30), (2, 50))]  # activations fill memory
    rows.append(peak_row(ctx, config(ctx, micro=4), None))
    relief = proposers.past_wall(ctx, evidence(ctx, *rows)).knobs
    assert relief is not None and moved(ctx, relief, config(ctx, micro=2)) == {"max_length": 64}
    # it fits, but measured slower than the incumbent (one noisy probe): the guide would stay around micro 2, so the
    # relief setting's next micro batch up comes first
    rows.append(dataclasses.replace(peak_row(ctx, relief, 40), objective=1.0, samples_per_s=1.0))
    step = proposers.past_wall(ctx, evidence(ctx, *rows))
    assert step.knobs is not None and step.knobs.micro_batch_size == 8 and not step.done
    assert moved(ctx, step.knobs, relief) == {}
    # once that is measured (here: it OOMs), the wall is passed and the guide takes over
    rows.append(peak_row(ctx, step.knobs, None))
    assert proposers.past_wall(ctx, evidence(ctx, *rows)).done
