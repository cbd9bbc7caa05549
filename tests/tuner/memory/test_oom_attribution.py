"""A probe's recorded failure attributed to the estimate's parts (tuner.memory.oom_match.attribute) and a trial's
explanation (tuner.memory.explain.explain_trial) in the view's text and JSON, on a synthetic trace (pure)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

from tests.tuner.memory.test_oom_message import GiB
from tests.tuner.memory.test_snapshot_parts import block, frame, snapshot
from trials.contract import FailedAllocation, Knobs
from tuner.cli.explain_view import as_json, lines
from tuner.memory.breakdown import (
    ACTIVATIONS,
    FORWARD_BACKWARD,
    OPTIMIZER_STEP,
    PARAMETERS,
    PARTS,
    ZERO_BUFFERS,
    Part,
    PhaseEstimate,
)
from tuner.memory.estimator import Estimator
from tuner.memory.explain import Inputs, MeasuredTrial, explain_trial
from tuner.memory.oom_match import attribute, estimate_phase, landing, zero_bucket
from tuner.memory.snapshot_child import read
from tuner.memory.trace import Trace, TracedAllocation, TracePoint

MiB = 1 << 20
SOFTMAX = TracedAllocation(op="_softmax.default", shape=[4, 8, 512, 512], dtype="float32", nbytes=4 * 8 * 512 * 512 * 4)
HIDDEN = TracedAllocation(op="mm.default", shape=[4, 512, 1024], dtype="float32", nbytes=4 * 512 * 1024 * 4)


def _trace() -> Trace:
    point = TracePoint(
        micro_batch_size=4,
        max_length=512,
        activation_bytes=200 * MiB,
        step_temp_bytes=10 * MiB,
        largest={FORWARD_BACKWARD: [SOFTMAX, HIDDEN]},
    )
    ckpt = point.model_copy(update={"gradient_checkpointing": True, "activation_bytes": 40 * MiB})
    return Trace(param_count=10_000_000, param_bytes=40_000_000, largest_param=1_000_000, points=[point, ckpt])


def _inputs(knobs: Knobs, capacity: int) -> Inputs:
    est = Estimator(trace=_trace(), world_size=1, global_batch=4)
    return Inputs(estimator=est, config=knobs, capacity=capacity, world_size=1, global_batch=4, traced_lengths=(512,))


def test_the_phase_of_a_record() -> None:
    assert estimate_phase("train", "forward") == estimate_phase("train", "backward") == FORWARD_BACKWARD
    assert estimate_phase("train", "optimizer step") == OPTIMIZER_STEP
    assert estimate_phase("eval", None) == "eval_forward" and estimate_phase("generate", None) == "generate"
    assert estimate_phase("train", None) is None and estimate_phase("setup", None) is None


def test_landing_walks_the_parts_in_their_printed_order() -> None:
    phase = PhaseEstimate(FORWARD_BACKWARD, (Part(PARAMETERS, 100), Part(ZERO_BUFFERS, 0), Part(ACTIVATIONS, 50)))
    assert landing(phase, 100).part == PARAMETERS
    found = landing(phase, 101)
    assert (found.part, found.start, found.end, found.total) == (ACTIVATIONS, 100, 150, 150)
    assert landing(phase, 151).part is None


def test_a_reduce_bucket_is_named_by_its_size() -> None:
    k = Knobs(micro_batch_size=4, max_length=512, zero_stage=2, reduce_bucket_size=200_000_000, overlap_comm=True)
    assert "reduce_bucket_size 200,000,000 x 4 bytes, overlap_comm keeps 2" in (zero_bucket(k, 800_000_000) or "")
    assert zero_bucket(k, 800_000_001) is None
    assert zero_bucket(k.model_copy(update={"zero_stage": 0}), 800_000_000) is None


def test_the_traced_op_and_shape_is_matched_and_lands_in_the_activations() -> None:
    k = Knobs(micro_batch_size=4, max_length=512, engine="torch")
    states = 16 * 10_000_000  # params + grads + AdamW's two states, fp32
    failed = FailedAllocation(
        nbytes=SOFTMAX.nbytes,
        live=states + 130 * MiB,  # 282.59 MiB in use: 32 MiB more does not fit in 300
        capacity=300 * MiB,
        op=SOFTMAX.op,
        shape=SOFTMAX.shape,
        dtype="float32",
        phase="train",
        stage="forward",
    )
    i = _inputs(k, 300 * MiB)
    found = explain_trial(
        i,
        MeasuredTrial(
            "s",
            0,
            "oom",
            "OutOfMemoryError: emulated device out of memory",
            {},
            None,
            failed.live + failed.nbytes,
            ((0, failed, "/db.oom-snapshots/s.snapshot.pickle"), (1, failed, None), (2, failed, None)),
        ),
    )
    a = attribute(failed, k, i.estimator.trace, found.breakdown)
    assert (a.phase, a.part) == (FORWARD_BACKWARD, ACTIVATIONS) and a.how == "its op and shape in the trace"
    assert a.traced is not None and a.traced.op == SOFTMAX.op and a.traced.length == 512
    assert a.landing is not None and a.landing.part == ACTIVATIONS

    text = "\n".join(lines(found, "tuner search --max-length 512"))
    assert "trial 0 of study s: oom" in text
    assert "tuner search --max-length 307\n" in text + "\n"  # the change's length replaces the job's
    assert (
        "attributed to the activations + temporaries of the train forward + backward, by its op and shape in the "
        "trace" in text
    )
    assert "matched: 32.00 MiB = the float32 attention matrix (softmax-sized, op _softmax.default)" in text
    assert "in use + asked = 314.59 MiB lands in the estimate's activations + temporaries" in text
    assert "memory snapshot: /db.oom-snapshots/s.snapshot.pickle (drag it onto pytorch.org/memory_viz)" in text
    assert text.count("recorded failure, rank") == 2 and "ranks 2 recorded theirs too" in text
    body = json.loads(as_json(found))
    assert len(body["trial"]["failures"]) == 3
    f = body["trial"]["failures"][0]
    assert (f["phase"], f["part"], f["failed"]["op"]) == (FORWARD_BACKWARD, ACTIVATIONS, SOFTMAX.op)
    assert body["trial"]["oom_need"] == failed.live + failed.nbytes and body["verdict"]["phase"] == FORWARD_BACKWARD


def test_an_ok_trial_sets_its_measured_phases_against_the_estimate() -> None:
    k = Knobs(micro_batch_size=4, max_length=512, engine="torch")
    i = _inputs(k, 8 * GiB)
    i.estimator.observe(k.model_copy(update={"micro_batch_size": 4}), 400 * MiB)
    found = explain_trial(i, MeasuredTrial("s", 3, "ok", None, {"train": 380 * MiB}, 380 * MiB, None))
    t = found.trial
    assert t is not None and t.calibration_probes == 1 and not t.failures
    (check,) = t.checks
    assert check.phase == "train" and check.estimate.phase == FORWARD_BACKWARD  # the larger of the step's phases
    assert check.measured == 380 * MiB and abs(check.error - (check.estimate.total / (380 * MiB) - 1)) < 1e-12
    text = "\n".join(lines(found, "tuner search"))
    assert "train step: measured 380.00 MiB, estimated" in text and "calibrated on the study's 1 other" in text
    assert json.loads(as_json(found))["trial"]["measured"][0]["phase"] == "train"


def test_a_failures_snapshot_read_is_in_the_json_beside_the_estimates_phase(tmp_path: Path) -> None:
    adam = [frame("/site-packages/torch/optim/adamw.py", "_init_group")]
    path = tmp_path / "r0.snapshot.pickle"
    path.write_bytes(pickle.dumps(snapshot(block(2 * GiB, adam), block(GiB, []))))
    k = Knobs(micro_batch_size=4, max_length=512, engine="torch")
    failed = FailedAllocation(nbytes=SOFTMAX.nbytes, live=250 * MiB, capacity=300 * MiB, phase="train", stage="forward")
    gone = str(tmp_path / "gone.pickle")
    measured = MeasuredTrial(
        "s",
        0,
        "oom",
        "OutOfMemoryError",
        {},
        None,
        failed.live + failed.nbytes,
        ((0, failed, str(path)), (1, failed, gone), (2, failed, None)),
        snapshot_reads=(read(str(path)), read(gone)),
    )
    found = explain_trial(_inputs(k, 300 * MiB), measured)
    failures = json.loads(as_json(found))["trial"]["failures"]
    first = failures[0]["snapshot_parts"]
    assert first["path"] == str(path) and first["error"] is None
    assert (
        first["attributed"]["parts"]["optimizer states"] == 2 * GiB and first["attributed"]["before_recording"] == GiB
    )
    estimate = found.breakdown.worst.phase(FORWARD_BACKWARD)
    assert first["estimate"] == {
        "phase": FORWARD_BACKWARD,
        "parts": {p: estimate.part(p) for p in PARTS},
        "total": estimate.total,
    }
    assert failures[1]["snapshot_parts"]["attributed"] is None
    assert failures[1]["snapshot_parts"]["error"].startswith("the file is gone")
    assert failures[2]["snapshot_parts"] is None  # no snapshot kept (the emulated device)
    text = "\n".join(lines(found, "tuner search"))
    assert "  memory snapshot not read: the file is gone" in text
    assert "    optimizer states" in text and "estimate" in text
