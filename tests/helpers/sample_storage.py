"""Sample studies written into a real storage through the writers `tuner search` uses: ``SampleStudy``, the one builder
every test uses for stored studies, and the API tests' study built with it (``populate``, ``define_only``).

``SampleStudy`` stores a study definition (Store.ensure_study), a search run (start_run / finish_run), Optuna trials in
Optuna's RDB tables as the search leaves them, and probe rows: a measured probe's row is built from its ProbeConfig
and ProbeResult by the search's own builder (tuner.search.observation.probe_row), a ruled-out config's by
``inferred_row``; ``record`` stores a hand-written row (an edge case: hostile text, partial knobs), ``again`` an
existing row once more with changes. Real storage, no mocks; the numbers of ``populate`` are chosen so the expected
best config is known.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.trial import TrialState

from trials.contract import Knobs, ProbeConfig, ProbeResult, RankMemory, StepStats
from tuner.job.objective import Objective
from tuner.records import Fidelity, ProbeRow
from tuner.search.evidence import Inference
from tuner.search.observation import inferred_row, probe_row
from tuner.storage import Store, optuna_storage

TOKENS = Objective("retained_tokens_per_s")  # without a dataset: samples/s x max_length


class SampleStudy:
    """One study in the storage at ``url`` (created with ``definition`` unless it exists), written as the search
    writes it. With ``worker``, a search run is open until ``finish``."""

    def __init__(
        self,
        url: str,
        name: str,
        definition: dict[str, Any] | None = None,
        distributions: dict[str, BaseDistribution] | None = None,
        *,
        worker: str | None = None,
        budget_s: float | None = None,
        headroom: float = 0.9,
    ) -> None:
        self.url = url
        self.store = Store(url)
        self.name = name
        self.distributions = distributions or {}
        self.headroom = headroom
        if definition is not None:
            self.store.ensure_study(name, definition)
        self.run_id = self.store.start_run(name, worker, budget_s, None) if worker else None

    @functools.cached_property
    def study(self) -> optuna.Study:
        """The Optuna study of the same name (created on first use, as the search creates it)."""
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        return optuna.create_study(
            study_name=self.name,
            storage=optuna_storage(self.url, None, None),
            direction="maximize",
            load_if_exists=True,
        )

    def trial(self, params: dict[str, Any], status: str, value: float | None = None, cause: str | None = None) -> None:
        """An Optuna trial as the search tells it: COMPLETE with its value for "ok", FAIL for an error, else PRUNED
        with its constraint violated (an OOM teaches TPE the infeasible region). ``cause`` goes to its user attrs."""
        state = {"ok": TrialState.COMPLETE, "error": TrialState.FAIL}.get(status, TrialState.PRUNED)
        self.study.add_trial(
            optuna.trial.create_trial(
                state=state,
                value=value if state == TrialState.COMPLETE else None,
                params=params,
                distributions={k: self.distributions[k] for k in params},
                user_attrs={"cause": cause} if cause else {},
                system_attrs={"constraints": [1.0]} if state == TrialState.PRUNED else {},
            )
        )

    def probe(
        self,
        config: ProbeConfig,
        result: ProbeResult,
        *,
        trial_number: int | None,
        config_key: str,
        fidelity: Fidelity | str = Fidelity.SHORT,
    ) -> ProbeRow:
        """Stores the row the search stores for ``result`` (tuner.search.observation.probe_row)."""
        row = probe_row(
            config,
            result,
            trial_number=trial_number,
            fidelity=Fidelity(fidelity),
            config_key=config_key,
            estimate_bytes=None,
            objective=TOKENS,
            device_memory=config.device_memory,
            headroom=self.headroom,
        )
        return self._store(row)

    def inferred(self, config: ProbeConfig, *, trial_number: int, config_key: str, cause: str | None) -> ProbeRow:
        """Stores the row of a config ruled out without running (tuner.search.observation.inferred_row)."""
        return self._store(
            inferred_row(trial_number, config, config_key, Inference("oom", cause), config.device_memory)
        )

    def record(self, **columns: Any) -> ProbeRow:
        """Stores a hand-written row (ProbeRow.from_record of ``columns``; an empty result unless given: a measured
        ok row has its result)."""
        row = ProbeRow.from_record({"study_name": self.name, "run_id": self.run_id, "result": {}, **columns})
        return dataclasses.replace(row, id=self.store.record_probe(row))

    def again(self, row: ProbeRow, **changes: Any) -> ProbeRow:
        """Stores ``row`` once more (the storage gives it a new id and time) with ``changes``: a confirmation, a later
        trial."""
        return self.record(**{**row.to_record(), **changes})

    def finish(self, reason: str = "budget reached") -> None:
        if self.run_id is not None:
            self.store.finish_run(self.run_id, "finished", reason)

    def _store(self, row: ProbeRow) -> ProbeRow:
        row = dataclasses.replace(row, study_name=self.name, run_id=self.run_id)
        return dataclasses.replace(row, id=self.store.record_probe(row))


# -- the API tests' study ---------------------------------------------------------------------------------------------
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


def _result(status: str, samples: float | None, peak: int | None, cause: str | None, max_length: int) -> ProbeResult:
    ranks = []
    if peak is not None:
        ranks = [
            RankMemory(rank=r, peak_allocated=peak * MiB - r * MiB, peak_reserved=peak * MiB, capacity=CAPACITY)
            for r in range(WORLD)
        ]
    steps = None
    if samples is not None:
        steps = StepStats(micro_mean_s=0.1, micro_p50_s=0.1, micro_max_s=0.12, optimizer_step_s=0.15, cycle_s=0.2)
    return ProbeResult.model_validate(
        {
            "status": status,
            "cause": cause,
            "samples_per_s": samples,
            "tokens_per_s": samples * max_length if samples is not None else None,
            "steps": steps,
            "ranks": ranks,
            "capacity": CAPACITY,
            "versions": {"torch": "2.13.0+cpu", "deepspeed": "0.19.8", "transformers": "5.24.0"},
            "fingerprint": {"device": "cpu", "cpus": 2, "host_memory": 24 << 30},
            "wall_s": 6.0,
            "setup_s": 3.0,
        }
    )


def populate(url: str, study: str = "t5-demo", *, max_length: int = 64) -> None:
    """A finished study with baseline, ok, oom, unstable, inferred and error trials, plus one RUNNING trial."""
    definition = {
        "model": "builtin:tiny-t5",
        "world_size": WORLD,
        "global_batch": GLOBAL_BATCH,
        "device_memory": CAPACITY,
        "headroom": 0.9,
        "budget_s": 120.0,
    }
    sample = SampleStudy(url, study, definition, DIST, worker="host-a:123", budget_s=120.0)
    done: set[int] = set()
    for trial, fidelity, micro, zero, status, samples, peak, cause in PLAN:
        knobs = Knobs(micro_batch_size=micro, max_length=max_length, zero_stage=zero)
        accum = GLOBAL_BATCH // (micro * WORLD) or 1
        cfg = ProbeConfig(knobs=knobs, world_size=WORLD, gradient_accumulation_steps=accum, device_memory=CAPACITY)
        key = config_key(knobs.model_dump(), accum)
        if fidelity == "inferred":
            sample.inferred(cfg, trial_number=trial, config_key=key, cause=cause)
        else:
            result = _result(status, samples, peak, cause, max_length)
            sample.probe(cfg, result, trial_number=trial, config_key=key, fidelity=fidelity)
        if trial not in done:
            done.add(trial)
            value = samples * max_length if samples is not None else None
            sample.trial({"micro_batch_size": micro, "zero_stage": zero}, status, value, cause)
    sample.study.ask(DIST)  # one trial still RUNNING
    sample.finish()


def define_only(url: str, study: str = "fresh") -> None:
    """A study that exists but has no probes yet."""
    Store(url).ensure_study(study, {"model": "builtin:tiny-t5", "world_size": 1, "headroom": 0.9})
