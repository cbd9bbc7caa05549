"""Builds the API's answers from storage rows: study status and progress, trial pages, the best config with its
provenance. Reads only; the routes stay thin."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import Counter
from dataclasses import dataclass
from typing import Any

from optuna.trial import TrialState

from api.deps import Services
from api.schemas import (
    BaselineOut,
    BestConfigOut,
    BestSoFarOut,
    ChangesOut,
    ProductionOut,
    ProgressOut,
    RunOut,
    StudyOut,
    StudySummaryOut,
    TrialPageOut,
)
from tuner.records import Candidate, ProbeRow, ProbeStatus
from tuner.records.run import RunStatus, SearchRun
from tuner.records.study import StudyRecord
from tuner.records.throughput import Throughput, speedup, throughput
from tuner.reporting.production import ProductionRun, production_runs
from tuner.reporting.trials import join_trials
from tuner.session.best import rank, serve_best
from tuner.storage import Store
from tuner.storage.optuna_trials import numbers
from tuner.storage.read_pool import ReadStore
from tuner.storage.trial_counts import stamp

_ENDED = frozenset(s.value for s in RunStatus if s.ended)  # a study status (study_status) that is a run's end


def study_status(runs: list[SearchRun], now: dt.datetime) -> str:
    """``now``: the database's clock (Store.db_now), the one the workers' heartbeats are written on, so an API host
    whose wall clock is off still reads a live worker as live."""
    if not runs:
        return "defined"
    if any(r.is_live(now) for r in runs):
        return RunStatus.RUNNING.value
    last = max(runs, key=lambda r: r.id).status
    return (last if last.ended else RunStatus.INTERRUPTED).value  # marked running, no longer beating


def summary(study: StudyRecord, runs: list[SearchRun], now: dt.datetime) -> StudySummaryOut:
    status = study_status(runs, now)
    return StudySummaryOut(name=study.name, created_at=study.created_at, created_by=study.created_by, status=status)


def _progress(runs: list[SearchRun], n_trials: int, n_probes: int, status: str, now: dt.datetime) -> ProgressOut:
    starts = [r.started_at for r in runs]
    live = [r for r in runs if r.is_live(now)]
    out = ProgressOut(started_at=min(starts) if starts else None, trials=n_trials, probes=n_probes)
    if live:
        begun = min(r.started_at for r in live)
        deadlines = [r.deadline_at for r in live if r.deadline_at is not None]
        out.elapsed_s = (now - begun).total_seconds()
        if deadlines:
            out.deadline_at = max(deadlines)
            out.remaining_s = max(0.0, (out.deadline_at - now).total_seconds())
            total = out.elapsed_s + out.remaining_s
            out.fraction = min(1.0, out.elapsed_s / total) if total > 0 else 1.0
    elif status in _ENDED:
        ends = [r.finished_at for r in runs if r.finished_at is not None]
        if starts and ends:
            out.elapsed_s = (max(ends) - min(starts)).total_seconds()
        out.remaining_s = 0.0
        out.fraction = 1.0
    else:
        out.fraction = 0.0
    return out


def _best_so_far(cand: Candidate | None) -> BestSoFarOut | None:
    figure = throughput(cand.rows) if cand is not None else None
    if cand is None or figure is None:
        return None
    return BestSoFarOut(
        trial_number=cand.trial_number,
        config_key=cand.config_key,
        knobs=cand.knobs,
        objective=figure.value,
        samples_per_s=figure.samples_per_s,
        peak_allocated=cand.peak_allocated,
        capacity=cand.capacity,
        confirmed=cand.confirmed,
    )


@dataclass(frozen=True)
class _Summary:
    """What GET /studies/{name} derives from the probe rows: cached together under one version (api.cache)."""

    probe_statuses: dict[str, int]
    best: BestSoFarOut | None


@dataclass(frozen=True)
class Ranked:
    """A study's probe rows and the best stable config among them: what its summary and every export format of
    GET /best-config derive from, loaded and ranked once per version of the rows (seconds on a 10,000-row study)."""

    rows: list[ProbeRow]
    best: Candidate | None


def ranked(store: Store, svc: Services, name: str) -> Ranked:
    return svc.ranking.get(store, name, "ranked", lambda: Ranked(*rank(store, name)))


def _summary_of(found: Ranked) -> _Summary:
    return _Summary(dict(Counter(r.status.value for r in found.rows)), _best_so_far(found.best))


def study_detail(store: ReadStore, svc: Services, study: StudyRecord) -> StudyOut:
    """The study with its progress and best so far: trial counts from the unfinished tail
    (tuner.storage.trial_counts), the probe counts and best so far cached until a probe row is added (api.cache), so
    the answer costs a few indexed queries whatever the size of the study."""
    name, definition = study.name, study.definition
    runs = store.runs(name)
    _, states = store.trials.study_counts(name)
    found = svc.cache.get(store, name, "summary", lambda: _summary_of(ranked(store, svc, name)))
    now = store.db_now()
    status = study_status(runs, now)
    budgets = [float(r.budget_s) for r in runs if r.budget_s]
    budget = definition.budget_s or (max(budgets) if budgets else None)
    return StudyOut(
        **summary(study, runs, now).model_dump(),
        definition=definition.to_json(),
        budget_s=budget,
        progress=_progress(runs, sum(states.values()), sum(found.probe_statuses.values()), status, now),
        best=found.best,
        trial_states=states,
        probe_statuses=found.probe_statuses,
        runs=[RunOut(**{**dataclasses.asdict(r), "status": r.status.value}) for r in runs],
    )


def _ranks(row: ProbeRow) -> list[dict[str, Any]]:
    """The per-rank peaks of a probe's result, as RankMemoryOut data (validated once, with the page)."""
    result = row.result or {}
    return [r for r in result.get("ranks") or [] if isinstance(r, dict) and "rank" in r]


def _probe(row: ProbeRow) -> dict[str, Any]:
    """A probe row as ProbeOut data: a page is validated in one pass (TrialPageOut.model_validate), not one model
    per nested object, which cost a 50-trial page most of its time."""
    assert row.id is not None and row.created_at is not None, "a stored row has its id and timestamp"
    return {
        "id": row.id,
        "fidelity": row.fidelity.value,
        "status": row.status.value,
        "cause": row.cause,
        "samples_per_s": row.samples_per_s,
        "tokens_per_s": row.tokens_per_s,
        "objective": row.objective,
        "peak_allocated": row.peak_allocated,
        "peak_reserved": row.peak_reserved,
        "capacity": row.capacity,
        "stable": row.stable,
        "probe_seconds": row.probe_seconds,
        "ranks": _ranks(row),
        "created_at": row.created_at,
    }


def trial_page(store: ReadStore, svc: Services, name: str, offset: int, limit: int, state: str | None) -> bytes:
    """One page of the study's trials (optionally of one Optuna state) with their probe rows, as the JSON of a
    TrialPageOut: paged and filtered in SQL (tuner.storage.optuna_trials), counted from the unfinished tail
    (tuner.storage.trial_counts), and built once per version of the study (api.cache: its trial counts and probe
    rows) when every trial on it has finished, so a page costs the same on a study of 10 trials or 10,000 and a
    repeated read costs its version."""
    sid, counts = store.trials.study_counts(name)
    total = counts.get(state, 0) if state is not None else sum(counts.values())
    version = (sid, stamp(counts), store.probe_version(name))
    page = svc.cache.get(
        store,
        name,
        f"trials:{offset}:{limit}:{state}",
        lambda: _page(store, name, sid, total, offset, limit, state),
        version=version,
        keep=lambda built: built.settled,
    )
    return page.json


@dataclass(frozen=True)
class _Page:
    json: bytes
    settled: bool  # every trial on it has finished, and so has the state it is filtered to: nothing on it can change


def _page(
    store: ReadStore, name: str, sid: int | None, total: int, offset: int, limit: int, state: str | None
) -> _Page:
    page = store.trials.page(sid, offset, limit, state)
    rows = store.probes_of_trials(name, numbers(page))
    out = [
        {
            "number": rec.number,
            "state": rec.state,
            "params": rec.params,
            "value": rec.value,
            "cause": rec.cause,
            "samples_per_s": rec.samples_per_s,
            "peak_allocated": rec.peak_allocated,
            "ranks": _ranks(rec.latest) if rec.latest else [],
            "probes": [_probe(r) for r in rec.probes],
        }
        for rec in join_trials(page, rows)
    ]
    built = TrialPageOut.model_validate(
        {"study": name, "total": total, "offset": offset, "limit": limit, "state": state, "trials": out}
    )
    settled = all(t.state.is_finished() for t in page) and (state is None or TrialState[state].is_finished())
    return _Page(built.model_dump_json().encode(), settled)


def _baseline(row: ProbeRow | None, pick: Throughput, mine: Throughput | None) -> BaselineOut | None:
    """The user's config beside the pick: its figure (the median of its config's probes, as the pick's) and the
    speed-up, the ratio of the two figures as every face prints them (tuner.records.throughput)."""
    if row is None:
        return None
    ok = row.status == ProbeStatus.OK and mine is not None
    return BaselineOut(
        status=row.status.value,
        samples_per_s=mine.samples_per_s if ok and mine is not None else row.samples_per_s,
        objective=mine.value if ok and mine is not None else row.objective,
        peak_allocated=row.peak_allocated,
        stable=row.stable,
        speedup=speedup(pick, mine) if ok else None,
    )


def _production(run: ProductionRun) -> ProductionOut:
    r, rec = run.row, run.recorded
    return ProductionOut(
        status=r.status.value,
        cause=r.cause,
        phase=rec.phase,
        peak_allocated=r.peak_allocated,
        peak_reserved=r.peak_reserved,
        capacity=r.capacity,
        memory=rec.memory,
        samples_per_s=r.samples_per_s,
        probed_peak=run.probed_peak,
        probed_samples_per_s=run.probed_samples_per_s,
        device=rec.device,
        rank=rec.rank,
        steps=rec.steps,
    )


def best_config(store: Store, name: str, fmt: str, found: Ranked) -> BestConfigOut:
    """The best stable config of ``name`` (``found``: its rows, ranked) with its provenance; ``content`` is its export
    in ``fmt`` (tuner.interop.export.render_best, as `tuner export` writes it)."""
    served = serve_best(store, name, fmt, ranked=(found.rows, found.best))  # its errors: tuner.session.best's
    definition, rows, best = served.definition, served.rows, served.best
    args = served.export_args
    world, accum = args.world_size, args.gradient_accumulation_steps
    measured = next((r.measurement for r in best.rows if r.result), None)
    reserved = [r.peak_reserved for r in best.rows if r.peak_reserved is not None]
    tokens = [r.tokens_per_s for r in best.rows if r.tokens_per_s is not None]
    headroom = definition.headroom
    content = served.content if fmt != "json" else None
    changes = ChangesOut(**served.changes.to_dict(), lines=served.change_lines)
    production = [_production(run) for run in production_runs(rows, best.config_key)]
    return BestConfigOut(
        study=name,
        format=fmt,
        trial_number=best.trial_number,
        config_key=best.config_key,
        knobs=best.knobs,
        engine=str(best.knobs.get("engine", "deepspeed")),
        world_size=world,
        nnodes=args.nnodes,
        gradient_accumulation_steps=accum,
        global_batch=int(best.knobs.get("micro_batch_size", 1)) * accum * world,
        objective=served.throughput.value,
        samples_per_s=served.throughput.samples_per_s,
        tokens_per_s=sorted(tokens)[len(tokens) // 2] if tokens else None,
        peak_allocated=best.peak_allocated,
        peak_reserved=max(reserved) if reserved else None,
        capacity=best.capacity,
        headroom=headroom,
        memory_fraction=best.peak_allocated / best.capacity if best.capacity else None,
        confirmed=best.confirmed,
        caveat=served.caveat,
        measurements=best.measurements,
        fingerprint=dict(measured.fingerprint) if measured else {},
        versions=dict(measured.versions) if measured else {},
        baseline=_baseline(served.baseline, served.throughput, served.baseline_throughput),
        changes=changes,
        production=production,
        content=content,
    )
