"""What a probe of a job with data runs (tuner.probing.batches): memory at the worst batch one rank can get, the eval
at the eval set's worst, the timed steps on batches drawn from the data per rank, seeded. Pure: no probe runs."""

from __future__ import annotations

import numpy as np

from trials.contract import BatchDims, JobSettings, Knobs, timed_micro_steps
from tuner.job.data_job import DataJob
from tuner.job.lengths import SampleLengths
from tuner.probing.batches import data_batches, drawn_tokens_per_sample

rng = np.random.default_rng(0)
INPUTS = np.concatenate([rng.integers(5, 40, 995), [3000, 2800, 2500, 2600, 2700]])
TARGETS = rng.integers(2, 12, len(INPUTS))
DATA = DataJob(SampleLengths(input=INPUTS, target=TARGETS), "long tail")
KNOBS = Knobs(micro_batch_size=4, max_length=3000, engine="torch")
JOB = JobSettings(max_target_length=int(TARGETS.max()))


def draw(knobs: Knobs = KNOBS, world: int = 1, seed: int = 0, data: DataJob = DATA, accum: int = 1):
    return data_batches(
        data, knobs, JOB, world_size=world, measure_steps=12, gradient_accumulation_steps=accum, seed=seed
    )


def test_memory_runs_the_worst_batch_and_the_timed_steps_the_datas_own():
    b = draw()
    # the longest sample shares its batch with shorter ones: the collator pads them (a causal LM builds its mask)
    assert b.worst == BatchDims(input_length=3000, target_length=int(TARGETS.max()), padded=True)
    assert b.eval_worst is None  # the job does not evaluate
    (steps,) = b.timed
    assert len(steps) == 12
    assert all(s.input_length in set(INPUTS.tolist()) and s.target_length in set(TARGETS.tolist()) for s in steps)
    assert max(s.input_length for s in steps) < 40 < b.worst.input_length  # this seed draws none of the tail
    assert all(s.real_tokens is not None and s.real_tokens <= 4 * s.input_length for s in steps)
    assert all(s.padded == (s.real_tokens is not None and s.real_tokens < 4 * s.input_length) for s in steps)


def test_the_same_seed_draws_the_same_shapes_and_another_seed_others():
    assert draw() == draw()
    assert draw(seed=1).timed != draw().timed
    # another micro batch of the same seed: the same shuffled order grouped differently
    twice = draw(knobs=KNOBS.model_copy(update={"micro_batch_size": 8}))
    assert twice.timed != draw().timed


def test_each_rank_draws_its_own_batches_for_as_many_steps_as_the_probe_times():
    b = draw(world=2, accum=4)
    steps = timed_micro_steps(12, 4)
    assert len(b.timed) == 2 and all(len(r) == steps for r in b.timed)
    assert b.timed[0] != b.timed[1]
    assert b.timed_for(1) == b.timed[1]


def test_truncation_and_the_eval_sets_worst_batch():
    short = KNOBS.model_copy(update={"max_length": 64, "eval_batch_size": 2})
    evals = SampleLengths(input=np.array([10, 50, 900]), target=np.array([3, 4, 5]))
    b = draw(knobs=short, data=DataJob(DATA.lengths, "long tail", eval_lengths=evals))
    assert b.worst.input_length == 64 and all(s.input_length <= 64 for s in b.timed[0])  # truncated at max_length
    # the eval set's worst, truncated alike: 10 tokens share a batch with 64 (padded)
    assert b.eval_worst == BatchDims(input_length=64, target_length=5, padded=True)


def test_tokens_per_sample_count_real_input_tokens_and_padded_ones_apart():
    b = draw()
    real, padded = drawn_tokens_per_sample(b, 4)
    shapes = b.timed[0]
    assert real == sum(s.real_tokens or 0 for s in shapes) / (4 * len(shapes))
    assert padded == sum(s.input_length for s in shapes) / len(shapes)
    assert 5 <= real < padded
