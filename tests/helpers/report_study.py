"""A report-shaped study written with tests.helpers.sample_storage.SampleStudy (the search's own writers): 48 probes
over micro batch x max_length x ZeRO stage, some OOM, one imbalanced 2-rank probe, one inferred OOM and one error whose
cause is hostile markup. Real storage, no mocks; ``populate_study`` returns what a reader must find (counts and the
best stable config). Shared by the report, dashboard, render and bad-input tests:
``from tests.helpers.report_study import populate_study``.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import optuna

from tests.helpers.sample_storage import SampleStudy
from trials.contract import FailedAllocation, Knobs, ProbeConfig, ProbeResult, RankMemory, StepStats
from tuner.records.ruled_out import RuledOutBy

MiB = 1 << 20
CAPACITY = 512 * MiB
HEADROOM = 0.9
XSS = '<script>document.title="pwned"</script>'


def _peak(micro: int, length: int, stage: int) -> int:
    state = {0: 240, 1: 160, 2: 120, 3: 80}[stage] * MiB
    return state + micro * length * 96 * 1024


def _result(micro: int, length: int, stage: int, world: int) -> ProbeResult:
    """What the probe of this config measured: an OOM past the capacity, else a throughput that grows with the micro
    batch and falls with the ZeRO stage and the length."""
    peak = _peak(micro, length, stage)
    if peak > CAPACITY:  # as the emulated device records it: in use when refused, the refused allocation, their sum
        live = CAPACITY - 8 * MiB
        refused = FailedAllocation(
            nbytes=peak - live, live=live, capacity=CAPACITY, op="aten::mm", shape=[micro, length, 512], phase="train"
        )
        return ProbeResult(
            status="oom",
            cause=f"torch.OutOfMemoryError: emulated device out of memory: tried to allocate "
            f"{(peak - live) / MiB:.2f} MiB with {live / MiB:.2f} MiB live of {CAPACITY / MiB:.2f} MiB capacity",
            ranks=[
                RankMemory(rank=0, peak_allocated=live, capacity=CAPACITY, oom_need=peak, failed_allocation=refused)
            ],
            capacity=CAPACITY,
            wall_s=3.0,
        )
    sps = 10.0 * micro**0.5 * (1 - 0.1 * stage) * (64 / length)
    ranks = [
        RankMemory(rank=r, peak_allocated=peak if r == 0 else int(peak * 0.6), peak_reserved=peak, capacity=CAPACITY)
        for r in range(world)
    ]
    return ProbeResult(
        status="ok",
        samples_per_s=sps,
        tokens_per_s=sps * length,
        steps=StepStats(micro_mean_s=0.1, micro_p50_s=0.1, micro_max_s=0.12, optimizer_step_s=0.15, cycle_s=0.4),
        ranks=ranks,
        capacity=CAPACITY,
        wall_s=5.0,
    )


def populate_study(url: str, name: str, *, two_rank_imbalance: bool = True, confirm: bool = True) -> dict[str, Any]:
    """A study of 40+ probes over micro batch x max_length x ZeRO stage, some OOM, one imbalanced 2-rank probe."""
    definition = {
        "model": {"source": "builtin:tiny-t5"},
        "device_memory": CAPACITY,
        "headroom": HEADROOM,
        "global_batch": 32,
        "world_size": 1,
        "note": XSS,
        "objective": {"kind": "retained_tokens_per_s", "lengths": []},  # as SampleStudy's rows measure it
    }
    dists = {
        "micro_batch_size": optuna.distributions.IntDistribution(1, 64, log=True),
        "max_length": optuna.distributions.CategoricalDistribution([64, 128]),
        "zero_stage": optuna.distributions.IntDistribution(0, 3),
    }
    sample = SampleStudy(url, name, definition, dists, headroom=HEADROOM)
    number = 0
    expected: dict[str, Any] = {"ok": 0, "oom": 0, "best": None}
    for stage in (0, 1, 2, 3):
        for length in (64, 128):
            for micro in (1, 2, 4, 8, 16, 32):
                knobs = Knobs(micro_batch_size=micro, max_length=length, zero_stage=stage)
                config = ProbeConfig(
                    knobs=knobs, gradient_accumulation_steps=max(1, 32 // micro), device_memory=CAPACITY
                )
                world = 2 if (two_rank_imbalance and stage == 2 and micro == 4 and length == 64) else 1
                params = {"micro_batch_size": micro, "max_length": length, "zero_stage": stage}
                key = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:16]
                result = _result(micro, length, stage, world)
                row = sample.probe(config, result, trial_number=number, config_key=key)
                sample.trial(params, result.status, row.objective)
                expected[result.status] += 1
                if row.stable and (expected["best"] is None or (row.objective or 0) > expected["best"][1]):
                    expected["best"] = (params, row.objective)
                number += 1
    # one inferred OOM (recorded without running) and one error with a hostile cause string
    partial = {"micro_batch_size": 64, "max_length": 128, "zero_stage": 0}
    sample.record(
        trial_number=None,
        fidelity="inferred",
        config_key="inf1",
        knobs=partial,
        config={},
        status="inferred-oom",
        stable=False,
    )
    # the pick confirmed (re-probed longer, the same figure) with its per-phase peaks: a confirm probe has no trial
    if confirm:
        _confirm(sample, expected["best"][0])
    # two configs ruled out as the search rules them out: by the memory estimate, by the OOM of trial 11 (micro 32,
    # length 128, ZeRO-0: the frontier)
    for key, ruled_knobs, ruled in (
        ("inf-est", {"micro_batch_size": 64, "max_length": 64, "zero_stage": 0}, RuledOutBy(estimate_bytes=700 * MiB)),
        (
            "inf-frontier",
            {"micro_batch_size": 64, "max_length": 128, "zero_stage": 1},
            RuledOutBy(measured={"micro_batch_size": 32, "max_length": 128, "zero_stage": 0}),
        ),
    ):
        sample.record(
            trial_number=None,
            fidelity="inferred",
            config_key=key,
            knobs=ruled_knobs,
            config={},
            status="inferred-oom",
            stable=False,
            estimate_bytes=ruled.estimate_bytes,
            result={"ruled_out_by": ruled.to_json()},
        )
    hostile = {"micro_batch_size": 3, "max_length": 64, "zero_stage": 1}
    sample.record(
        trial_number=number,
        fidelity="short",
        config_key="err1",
        knobs=hostile,
        config={},
        status="error",
        cause="ValueError: " + XSS,
        stable=False,
    )
    expected["probes"] = number + 4 + int(confirm)
    expected["oom_need"] = {  # trial -> bytes: what each OOM needed (in use + the refused allocation)
        n: _peak(m, length, stage)
        for n, (stage, length, m) in enumerate(
            (s, ln, m) for s in (0, 1, 2, 3) for ln in (64, 128) for m in (1, 2, 4, 8, 16, 32)
        )
        if _peak(m, length, stage) > CAPACITY
    }
    return expected


def _confirm(sample: SampleStudy, best_params: dict[str, int]) -> None:
    """A confirm probe of the best config: the same figure, with its per-phase peaks."""
    micro, length, stage = (best_params[k] for k in ("micro_batch_size", "max_length", "zero_stage"))
    confirmed = _result(micro, length, stage, 1)
    peak = confirmed.ranks[0].peak_allocated
    confirmed.ranks[0].phases.update({"train": peak, "eval_forward": peak // 3})
    config = ProbeConfig(
        knobs=Knobs(**best_params), gradient_accumulation_steps=max(1, 32 // micro), device_memory=CAPACITY
    )
    key = hashlib.sha256(json.dumps(best_params, sort_keys=True).encode()).hexdigest()[:16]
    sample.probe(config, confirmed, trial_number=None, config_key=key, fidelity="confirm")
