"""The strategy's parts on their own: the evidence, each proposer, the confirm rule (pure, no Optuna, no probes)."""

import dataclasses
import random

from tuner.job.space import space_from_dict
from tuner.records import Candidate, Fidelity, ProbeRow, ProbeStatus
from tuner.records.ruled_out import RuledOutBy
from tuner.search import confirm, proposers
from tuner.search.evidence import Evidence, fits
from tuner.search.schedule import Schedule

MiB = 2**20
SPACE = {
    "micro_batch_size": [1, 2, 4, 8, 16],
    "max_length": [128],
    "zero_stage": [0],
    "gradient_checkpointing": [False],
}


def context(schedule=None, device_memory=100 * MiB):
    return proposers.Context(
        space=space_from_dict(SPACE),
        world_size=1,
        global_batch=16,
        headroom=0.9,
        device_memory=device_memory,
        schedule=schedule or Schedule(),
        rng=random.Random(0),
    )


def row(ctx, micro, status="ok", stable=True, fidelity="short", peak=10 * MiB):
    knobs = ctx.space.sample(proposers.PlainSuggester(micro))
    return ProbeRow.from_record(
        {
            "result": {},  # a measured ok row has its result (ProbeRow's invariant)
            "config_key": ctx.key(knobs),
            "fidelity": fidelity,
            "knobs": knobs.model_dump(mode="json"),
            "config": {},
            "status": status,
            "stable": stable,
            "objective": float(micro) if status == "ok" else None,
            "samples_per_s": float(micro),
            "peak_allocated": peak if status == "ok" else None,
            "capacity": 100 * MiB,
        }
    )


class Linear:
    """An estimator whose calibrated peak is 12 MiB per sample."""

    def __init__(self):
        self.seen = []

    def predict(self, knobs):
        return type("E", (), {"calibrated": knobs.micro_batch_size * 12 * MiB})()

    def observe(self, knobs, peak):
        self.seen.append((knobs.micro_batch_size, peak))


def test_fits_reads_status_and_stability():
    def status(status, stable=False):
        return ProbeRow.from_record(
            {"config_key": "k", "fidelity": "short", "knobs": {}, "status": status, "stable": stable}
            | ({"result": {}, "peak_allocated": 1} if status == "ok" else {})
        )

    assert fits(status("ok", stable=True)) is True
    assert fits(status("ok")) is False  # above the headroom: does not fit
    assert fits(status("oom")) is False
    assert fits(status("timeout")) is None and fits(status("error")) is None


def test_evidence_learns_once_per_config_and_infers_from_the_frontier():
    ctx, ev = context(), Evidence(estimator=Linear(), device_memory=100 * MiB)
    ev.load([row(ctx, 4), row(ctx, 4), row(ctx, 8, status="oom")])
    assert ev.estimator.seen == [(4, 10 * MiB)]  # the repeat is not fed twice
    big = ctx.space.sample(proposers.PlainSuggester(16))
    assert ev.infer(big).verdict == "oom" and "oom" in (ev.infer(big).cause or "")
    small = ctx.space.sample(proposers.PlainSuggester(2))
    assert ev.infer(small).verdict is None and ev.infer(small).estimate == 24 * MiB


def test_evidence_rules_out_far_over_the_estimate_margin():
    ev = Evidence(estimator=Linear(), device_memory=100 * MiB, estimate_margin=1.5)
    ctx = context()
    assert ev.infer(ctx.space.sample(proposers.PlainSuggester(16))).verdict == "oom"  # 192 MiB > 150 MiB
    assert ev.infer(ctx.space.sample(proposers.PlainSuggester(8))).verdict is None  # 96 MiB: probe it


def test_evidence_measured_prefers_a_measurement_over_an_inference():
    ctx, ev = context(), Evidence()
    inferred = dataclasses.replace(
        row(ctx, 4),
        fidelity=Fidelity.INFERRED,
        status=ProbeStatus.INFERRED_OOM,
        result=None,
        ruled_out_by=RuledOutBy(stated="inferred-oom: test"),
    )
    measured = row(ctx, 4)
    ev.load([inferred, measured])
    assert ev.measured(measured.config_key) is measured
    ev.load([inferred])
    assert ev.measured(measured.config_key) is inferred


def test_opening_bisects_the_micro_batch_then_is_done():
    ctx, ev = context(), Evidence()
    first = proposers.opening(ctx, ev)
    assert first.knobs is not None and first.knobs.micro_batch_size == 4 and not first.done
    ev.load([row(ctx, m) for m in (1, 2, 4, 8, 16)])
    assert proposers.opening(ctx, ev).done


def test_opening_with_the_estimate_probes_the_largest_predicted_stable_and_records_the_far_one():
    ctx, ev = context(), Evidence(estimator=Linear(), device_memory=100 * MiB)
    out = proposers.opening(ctx, ev)
    assert out.done and out.knobs is not None and out.knobs.micro_batch_size == 4  # 48 MiB <= 90 MiB < 96 MiB
    assert [k.micro_batch_size for k in out.ruled_out] == [16]  # the smallest one above 1.5 x capacity


def test_opening_off_and_guide_off_name_nothing():
    ctx, ev = context(Schedule(seed_bisection=False, guide=False)), Evidence()
    assert proposers.opening(ctx, ev) == proposers.Proposed()
    assert proposers.guided(ctx, ev) == proposers.Proposed()


def test_random_unknown_skips_known_and_ruled_out_configs_and_says_when_none_is_left():
    ctx, ev = context(), Evidence()
    ev.load([row(ctx, m) for m in (1, 2, 4)] + [row(ctx, 8, status="oom")])
    pick = proposers.random_unknown(ctx, ev)
    assert pick.knobs is None and pick.done  # 16 needs more than the OOM at 8: nothing left
    ev.load([row(ctx, m) for m in (1, 2)])
    assert proposers.random_unknown(ctx, ev).knobs.micro_batch_size in (4, 8, 16)


def candidate(key, score, upper, confirmed=False):
    return Candidate(
        config_key=key,
        knobs={},
        config={},
        objective=1.0,
        samples_per_s=1.0,
        peak_allocated=0,
        capacity=None,
        confirmed=confirmed,
        measurements=1,
        trial_number=None,
        score=score,
        upper=upper,
    )


def test_confirm_takes_the_top_finalists_then_contenders_that_could_still_win():
    schedule = Schedule(finalists=2, max_finalists=3)
    found = [candidate("a", 3.0, 3.2), candidate("b", 2.0, 2.5), candidate("c", 1.0, 1.5)]
    assert confirm.next_finalist(found, set(), schedule).config_key == "a"
    assert confirm.next_finalist(found, {"a"}, schedule).config_key == "b"
    assert confirm.pending(found, schedule) == 2
    done = [candidate("a", 3.0, 3.2, True), candidate("b", 2.0, 2.5, True), candidate("c", 1.0, 3.1)]
    assert confirm.next_finalist(done, set(), schedule).config_key == "c"  # its upper bound reaches a's score
    hopeless = [*done[:2], candidate("c", 1.0, 1.5)]
    assert confirm.next_finalist(hopeless, set(), schedule) is None
