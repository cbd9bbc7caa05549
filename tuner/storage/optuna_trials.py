"""Pages of a study's Optuna trials read in SQL, at the cost of the page: Optuna's RDBStorage has no paged read
(``get_all_trials`` loads every trial with its params, values and attributes; a 10,000-trial study cost a trials page
seconds). These queries read Optuna's own tables through Optuna's own table definitions
(optuna.storages._rdb.models), so they follow the installed Optuna's schema; nothing here writes.

A trial's ``number`` is its rank by ``trial_id`` within the study (Optuna's RDBStorage numbers a new trial by counting
the study's trials of smaller id), so paging by ``trial_id`` is paging by number, on the primary key and the
``study_id`` index, without a sort."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from optuna.distributions import json_to_distribution
from optuna.storages._rdb import models
from optuna.trial import TrialState

TRIALS = models.TrialModel.__table__
STUDIES = models.StudyModel.__table__
PARAMS = models.TrialParamModel.__table__
VALUES = models.TrialValueModel.__table__
USER_ATTRS = models.TrialUserAttributeModel.__table__
STATES = tuple(s.name for s in TrialState)


@dataclass
class PagedTrial:
    """What tuner.reporting.trials.join_trials reads of a trial (its TrialLike protocol)."""

    number: int
    state: TrialState
    params: dict[str, Any] = field(default_factory=dict)
    values: list[float] | None = None
    user_attrs: dict[str, Any] = field(default_factory=dict)


def has_optuna_tables(conn: sa.Connection) -> bool:
    """False until a worker (or `tuner db upgrade`) has created Optuna's tables."""
    return sa.inspect(conn).has_table(STUDIES.name)


def study_id(conn: sa.Connection, name: str) -> int | None:
    row = conn.execute(sa.select(STUDIES.c.study_id).where(STUDIES.c.study_name == name)).first()
    return int(row[0]) if row else None


def state_of(value: Any) -> TrialState:
    return value if isinstance(value, TrialState) else TrialState[str(value)]


def trial_page(conn: sa.Connection, sid: int, offset: int, limit: int, state: str | None = None) -> list[PagedTrial]:
    """The page of the study's trials (of ``state``, when given) from ``offset``, in number order: one page of
    trials and one query each for their params, values and user attributes."""
    where = [TRIALS.c.study_id == sid]
    if state is not None:
        where.append(TRIALS.c.state == TrialState[state])
    rows = conn.execute(
        sa.select(TRIALS.c.trial_id, TRIALS.c.number, TRIALS.c.state)
        .where(*where)
        .order_by(TRIALS.c.trial_id)
        .offset(offset)
        .limit(limit)
    ).all()
    if not rows:
        return []
    page = {int(r.trial_id): PagedTrial(number=int(r.number), state=state_of(r.state)) for r in rows}
    ids = list(page)
    for tid, name, value, dist in conn.execute(
        sa.select(PARAMS.c.trial_id, PARAMS.c.param_name, PARAMS.c.param_value, PARAMS.c.distribution_json).where(
            PARAMS.c.trial_id.in_(ids)
        )
    ).all():
        page[int(tid)].params[str(name)] = json_to_distribution(dist).to_external_repr(value)
    values: dict[int, dict[int, float]] = {}
    for tid, objective, value, kind in conn.execute(
        sa.select(VALUES.c.trial_id, VALUES.c.objective, VALUES.c.value, VALUES.c.value_type).where(
            VALUES.c.trial_id.in_(ids)
        )
    ).all():
        values.setdefault(int(tid), {})[int(objective)] = models.TrialValueModel.stored_repr_to_value(value, kind)
    for tid, by_objective in values.items():
        page[tid].values = [by_objective[k] for k in sorted(by_objective)]
    for tid, key, value_json in conn.execute(
        sa.select(USER_ATTRS.c.trial_id, USER_ATTRS.c.key, USER_ATTRS.c.value_json).where(
            USER_ATTRS.c.trial_id.in_(ids)
        )
    ).all():
        page[int(tid)].user_attrs[str(key)] = json.loads(value_json)
    return list(page.values())


def numbers(trials: Sequence[PagedTrial]) -> list[int]:
    return [t.number for t in trials]


__all__ = [
    "STATES",
    "PagedTrial",
    "has_optuna_tables",
    "numbers",
    "state_of",
    "study_id",
    "trial_page",
]
