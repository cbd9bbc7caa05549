"""Writes a realistic study into a storage through the same public writers `tuner search` uses: Store.ensure_study,
start_run/finish_run, record_probe, and Optuna trials in Optuna's RDB tables. Real storage, no mocks; the numbers are
chosen so the expected best config is known. Also used by benchmarks/api_latency.py."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution, IntDistribution
from optuna.trial import TrialState

from trials.contract import Knobs, ProbeConfig, ProbeResult, RankMemory, StepStats
from tuner.records import ProbeRow
from tuner.storage import Store, optuna_storage

MiB = 1 << 20
CAPACITY = 160 * MiB
WORLD = 2
GLOBAL_BATCH = 16
DIST = {
    "micro_batch_size": IntDistribution(1, 8),
    "zero_stage": CategoricalDistribution([0, 1, 2, 3]),
}

# (trial, fidelity, micro, zero, status, samples/s, peak MiB, cause)
PLAN: list[tuple[int, str, int, int, str, float | None, int | None, str | None]] = [
    (0, "baseline", 1, 2, "ok", 10.0, 60, None),
    (1, "short", 8, 0, "oom", None, 170, "torch.OutOfMemoryError: emulated device of 160 MiB exhausted"),
    (2, "short", 4, 2, "ok", 20.0, 120, None),
    (2, "confirm", 4, 2, "ok", 19.0, 121, None),
    (3, "short", 8, 2, "ok", 30.0, 150, None),  # peak over 0.9 x capacity: fast but not stable
    (4, "inferred", 8, 1, "inferred-oom", None, None, "inferred-oom: needs at least as much memory as trial 1"),
    (5, "short", 2, 3, "error", None, None, "RuntimeError: gloo connect failed"),
    (6, "short", 2, 1, "ok", 15.0, 80, None),
]
BEST_TRIAL = 2  # confirmed and stable beats the faster unconfirmed/unstable ones


def config_key(knobs: dict[str, Any], accum: int) -> str:
    blob = json.dumps({"knobs": knobs, "world": WORLD, "accum": accum}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def _result(status: str, samples: float | None, peak: int | None, cause: str | None, max_length: int) -> dict:
    ranks = []
    if peak is not None:
        ranks = [
            RankMemory(rank=r, peak_allocated=peak * MiB - r * MiB, peak_reserved=peak * MiB, capacity=CAPACITY)
            for r in range(WORLD)
        ]
    steps = None
    if samples is not None:
        steps = StepStats(micro_mean_s=0.1, micro_p50_s=0.1, micro_max_s=0.12, optimizer_step_s=0.15, cycle_s=0.2)
    return ProbeResult(
        status=status if status in ("ok", "oom", "timeout", "error") else "oom",  # type: ignore[arg-type]
        cause=cause,
        samples_per_s=samples,
        tokens_per_s=samples * max_length if samples is not None else None,
        steps=steps,
        ranks=ranks,
        capacity=CAPACITY,
        versions={"torch": "2.13.0+cpu", "deepspeed": "0.19.8", "transformers": "5.24.0"},
        fingerprint={"device": "cpu", "cpus": 2, "host_memory": 24 << 30},
        wall_s=6.0,
        setup_s=3.0,
    ).model_dump(mode="json")


def populate(url: str, study: str = "t5-demo", *, max_length: int = 64) -> None:
    """A finished study with baseline, ok, oom, unstable, inferred and error trials, plus one RUNNING trial."""
    store = Store(url)
    store.ensure_study(
        study,
        {
            "model": "builtin:tiny-t5",
            "world_size": WORLD,
            "global_batch": GLOBAL_BATCH,
            "device_memory": CAPACITY,
            "headroom": 0.9,
            "budget_s": 120.0,
        },
    )
    run = store.start_run(study, "host-a:123", 120.0, None)
    ostudy = optuna.create_study(
        study_name=study, storage=optuna_storage(url, None, None), direction="maximize", load_if_exists=True
    )
    done: set[int] = set()
    for trial, fidelity, micro, zero, status, samples, peak, cause in PLAN:
        knobs = Knobs(micro_batch_size=micro, max_length=max_length, zero_stage=zero).model_dump()
        accum = GLOBAL_BATCH // (micro * WORLD) or 1
        cfg = ProbeConfig(
            knobs=Knobs(**knobs), world_size=WORLD, gradient_accumulation_steps=accum, device_memory=CAPACITY
        )
        stable = status == "ok" and peak is not None and peak * MiB <= 0.9 * CAPACITY
        objective = samples * max_length if samples is not None else None
        store.record_probe(
            ProbeRow.from_record(
                {
                    "study_name": study,
                    "trial_number": trial,
                    "run_id": run,
                    "fidelity": fidelity,
                    "config_key": config_key(knobs, accum),
                    "knobs": knobs,
                    "config": cfg.model_dump(mode="json"),
                    "status": status,
                    "cause": cause,
                    "samples_per_s": samples,
                    "tokens_per_s": objective,
                    "objective": objective,
                    "peak_allocated": peak * MiB if peak is not None else None,
                    "peak_reserved": peak * MiB if peak is not None else None,
                    "capacity": CAPACITY,
                    "alloc_retries": 0,
                    "stable": stable,
                    "probe_seconds": 6.0,
                    "setup_s": 3.0,
                    "result": _result(status, samples, peak, cause, max_length) if fidelity != "inferred" else None,
                }
            )
        )
        if trial in done:
            continue
        done.add(trial)
        state = {"ok": TrialState.COMPLETE, "error": TrialState.FAIL}.get(status, TrialState.PRUNED)
        ostudy.add_trial(
            optuna.trial.create_trial(
                state=state,
                value=objective if state == TrialState.COMPLETE else None,
                params={"micro_batch_size": micro, "zero_stage": zero},
                distributions=DIST,
                user_attrs={"cause": cause} if cause else {},
            )
        )
    ostudy.ask(DIST)  # one trial still RUNNING
    store.finish_run(run, "finished", "budget reached")


def define_only(url: str, study: str = "fresh") -> None:
    """A study that exists but has no probes yet."""
    Store(url).ensure_study(study, {"model": "builtin:tiny-t5", "world_size": 1, "headroom": 0.9})
