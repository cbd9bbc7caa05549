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
from trials.contract import Knobs, ProbeConfig, ProbeResult, RankMemory, StepStats

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
    if peak > CAPACITY:
        return ProbeResult(
            status="oom",
            cause="torch.OutOfMemoryError: emulated device full",
            ranks=[RankMemory(rank=0, peak_allocated=CAPACITY, capacity=CAPACITY)],
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


def populate_study(url: str, name: str, *, two_rank_imbalance: bool = True) -> dict[str, Any]:
    """A study of 40+ probes over micro batch x max_length x ZeRO stage, some OOM, one imbalanced 2-rank probe."""
    definition = {
        "model": {"source": "builtin:tiny-t5"},
        "device_memory": CAPACITY,
        "headroom": HEADROOM,
        "global_batch": 32,
        "world_size": 1,
        "note": XSS,
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
    expected["probes"] = number + 2
    return expected
