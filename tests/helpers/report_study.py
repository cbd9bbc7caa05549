"""A report-shaped study written into a storage through the same public writers the search uses (Store.ensure_study,
record_probe, Optuna trials): 48 probes over micro batch x max_length x ZeRO stage, some OOM, one imbalanced 2-rank
probe, one inferred OOM and one error whose cause is hostile markup. Real storage, no mocks; ``populate_study`` returns
what a reader must find (counts and the best stable config). Shared by the report, dashboard, render and bad-input
tests: ``from report_study import populate_study`` (tests/ is on sys.path through tests/conftest.py, like servers.py).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from typing import Any

import optuna

from trials.contract import Knobs, ProbeConfig, ProbeResult, RankMemory, StepStats
from tuner.records import ProbeRow, is_stable
from tuner.storage.db import optuna_storage
from tuner.storage.store import Store

MiB = 1 << 20
CAPACITY = 512 * MiB
HEADROOM = 0.9
XSS = '<script>document.title="pwned"</script>'


def _peak(micro: int, length: int, stage: int) -> int:
    state = {0: 240, 1: 160, 2: 120, 3: 80}[stage] * MiB
    return state + micro * length * 96 * 1024


def populate_study(url: str, name: str, *, two_rank_imbalance: bool = True) -> dict[str, Any]:
    """A study of 40+ probes over micro batch x max_length x ZeRO stage, some OOM, one imbalanced 2-rank probe."""
    store = Store(url)
    store.ensure_study(
        name,
        {
            "model": {"source": "builtin:tiny-t5"},
            "device_memory": CAPACITY,
            "headroom": HEADROOM,
            "global_batch": 32,
            "world_size": 1,
            "note": XSS,
        },
    )
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name=name, storage=optuna_storage(url), direction="maximize", load_if_exists=True)
    dists = {
        "micro_batch_size": optuna.distributions.IntDistribution(1, 64, log=True),
        "max_length": optuna.distributions.CategoricalDistribution([64, 128]),
        "zero_stage": optuna.distributions.IntDistribution(0, 3),
    }
    start = dt.datetime(2026, 1, 1, 12, tzinfo=dt.timezone.utc)
    number = 0
    expected: dict[str, Any] = {"ok": 0, "oom": 0, "best": None}
    for stage in (0, 1, 2, 3):
        for length in (64, 128):
            for micro in (1, 2, 4, 8, 16, 32):
                knobs = Knobs(micro_batch_size=micro, max_length=length, zero_stage=stage)
                config = ProbeConfig(
                    knobs=knobs, gradient_accumulation_steps=max(1, 32 // micro), device_memory=CAPACITY
                )
                peak = _peak(micro, length, stage)
                world = 2 if (two_rank_imbalance and stage == 2 and micro == 4 and length == 64) else 1
                if peak > CAPACITY:
                    result = ProbeResult(
                        status="oom",
                        cause="torch.OutOfMemoryError: emulated device full",
                        ranks=[RankMemory(rank=0, peak_allocated=CAPACITY, capacity=CAPACITY)],
                        capacity=CAPACITY,
                        wall_s=3.0,
                    )
                    value = None
                else:
                    sps = 10.0 * micro**0.5 * (1 - 0.1 * stage) * (64 / length)
                    ranks = [
                        RankMemory(
                            rank=r,
                            peak_allocated=peak if r == 0 else int(peak * 0.6),
                            peak_reserved=peak,
                            capacity=CAPACITY,
                        )
                        for r in range(world)
                    ]
                    result = ProbeResult(
                        status="ok",
                        samples_per_s=sps,
                        tokens_per_s=sps * length,
                        steps=StepStats(
                            micro_mean_s=0.1, micro_p50_s=0.1, micro_max_s=0.12, optimizer_step_s=0.15, cycle_s=0.4
                        ),
                        ranks=ranks,
                        capacity=CAPACITY,
                        wall_s=5.0,
                    )
                    value = sps * length
                stable = is_stable(result.status, result.peak_allocated, CAPACITY, HEADROOM, result.alloc_retries)
                params = {"micro_batch_size": micro, "max_length": length, "zero_stage": stage}
                if value is None:
                    trial = optuna.trial.create_trial(
                        params=params,
                        distributions=dists,
                        state=optuna.trial.TrialState.PRUNED,
                        system_attrs={"constraints": [1.0]},
                    )
                    expected["oom"] += 1
                else:
                    trial = optuna.trial.create_trial(params=params, distributions=dists, value=value)
                    expected["ok"] += 1
                    if stable and (expected["best"] is None or value > expected["best"][1]):
                        expected["best"] = (params, value)
                study.add_trial(trial)
                key = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:16]
                store.record_probe(
                    ProbeRow.from_record(
                        {
                            "study_name": name,
                            "trial_number": number,
                            "fidelity": "short",
                            "config_key": key,
                            "knobs": knobs.model_dump(mode="json"),
                            "config": config.model_dump(mode="json"),
                            "status": result.status,
                            "cause": result.cause,
                            "samples_per_s": result.samples_per_s,
                            "tokens_per_s": result.tokens_per_s,
                            "objective": value,
                            "peak_allocated": result.peak_allocated,
                            "peak_reserved": result.peak_reserved,
                            "capacity": CAPACITY,
                            "alloc_retries": result.alloc_retries,
                            "stable": stable,
                            "probe_seconds": result.wall_s,
                            "result": result.model_dump(mode="json"),
                            "created_at": start + dt.timedelta(seconds=30 * number),
                        }
                    )
                )
                number += 1
    # one inferred OOM (recorded without running) and one error with a hostile cause string
    store.record_probe(
        ProbeRow.from_record(
            {
                "study_name": name,
                "trial_number": None,
                "fidelity": "inferred",
                "config_key": "inf1",
                "knobs": {"micro_batch_size": 64, "max_length": 128, "zero_stage": 0},
                "config": {},
                "status": "inferred-oom",
                "stable": False,
                "created_at": start + dt.timedelta(seconds=30 * number),
            }
        )
    )
    store.record_probe(
        ProbeRow.from_record(
            {
                "study_name": name,
                "trial_number": number,
                "fidelity": "short",
                "config_key": "err1",
                "knobs": {"micro_batch_size": 3, "max_length": 64, "zero_stage": 1},
                "config": {},
                "status": "error",
                "cause": "ValueError: " + XSS,
                "stable": False,
                "created_at": start + dt.timedelta(seconds=30 * number),
            }
        )
    )
    expected["probes"] = number + 2
    return expected
