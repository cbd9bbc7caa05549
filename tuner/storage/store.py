"""Reads and writes of the project's own tables. One small class, one concept: what was probed and by whom."""

from __future__ import annotations

import datetime as dt
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError, OperationalError

from tuner.errors import StudyNotFound
from tuner.search.rows import ProbeRow
from tuner.storage.db import _unreachable, ensure_schema
from tuner.storage.schema import claims, probes, search_runs, studies


def _primary_key(res: sa.CursorResult[Any]) -> int:
    key = res.inserted_primary_key
    assert key is not None, "an INSERT of one row returns its primary key"
    return int(key[0])


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class Store:
    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = ensure_schema(url)

    # -- studies ---------------------------------------------------------------------------------------------------
    def ensure_study(self, name: str, definition: dict[str, Any], created_by: str = "cli") -> dict[str, Any]:
        """Returns the stored definition of ``name``, creating it from ``definition`` when new."""
        existing = self.study_definition(name)
        if existing is not None:
            return existing
        try:
            with self.engine.begin() as conn:
                conn.execute(
                    sa.insert(studies).values(name=name, created_at=now(), definition=definition, created_by=created_by)
                )
        except IntegrityError:  # another worker created it first
            pass
        return self.study_definition(name) or definition

    def study_definition(self, name: str) -> dict[str, Any] | None:
        with self._connect() as conn:
            row = conn.execute(sa.select(studies.c.definition).where(studies.c.name == name)).first()
        return dict(row[0]) if row else None

    def study_rows(self) -> list[dict[str, Any]]:
        """All study definitions, newest first."""
        with self._connect() as conn:
            rows = conn.execute(sa.select(studies).order_by(studies.c.created_at.desc(), studies.c.id.desc())).all()
        return [dict(r._mapping) for r in rows]

    def require_study(self, name: str) -> dict[str, Any]:
        definition = self.study_definition(name)
        if definition is None:
            raise StudyNotFound(f"no study named {name!r} in this storage; `tuner studies` lists the known ones")
        return definition

    # -- search runs -----------------------------------------------------------------------------------------------
    def start_run(self, study_name: str, worker: str, budget_s: float | None, deadline: dt.datetime | None) -> int:
        with self.engine.begin() as conn:
            res = conn.execute(
                sa.insert(search_runs).values(
                    study_name=study_name,
                    worker=worker,
                    started_at=now(),
                    heartbeat_at=now(),
                    deadline_at=deadline,
                    budget_s=budget_s,
                    status="running",
                )
            )
            return int(_primary_key(res))

    def heartbeat(self, run_id: int) -> None:
        with self.engine.begin() as conn:
            conn.execute(sa.update(search_runs).where(search_runs.c.id == run_id).values(heartbeat_at=now()))

    def finish_run(self, run_id: int, status: str, message: str | None = None) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                sa.update(search_runs)
                .where(search_runs.c.id == run_id)
                .values(status=status, message=message, finished_at=now())
            )

    def runs(self, study_name: str) -> list[dict[str, Any]]:
        with self._connect() as conn:
            rows = conn.execute(
                sa.select(search_runs).where(search_runs.c.study_name == study_name).order_by(search_runs.c.id)
            ).all()
        return [dict(r._mapping) for r in rows]

    # -- claims and probes -----------------------------------------------------------------------------------------
    def claim(self, study_name: str, config_key: str, fidelity: str, trial_number: int | None, worker: str) -> bool:
        """True when this worker now owns (config_key, fidelity) in the study; False when someone else already does."""
        try:
            with self.engine.begin() as conn:
                conn.execute(
                    sa.insert(claims).values(
                        study_name=study_name,
                        config_key=config_key,
                        fidelity=fidelity,
                        trial_number=trial_number,
                        worker=worker,
                        claimed_at=now(),
                    )
                )
        except IntegrityError:
            return False
        return True

    def claim_owner(self, study_name: str, config_key: str, fidelity: str) -> str | None:
        """The worker holding the claim on (config_key, fidelity), or None."""
        with self._connect() as conn:
            row = conn.execute(
                sa.select(claims.c.worker).where(
                    claims.c.study_name == study_name,
                    claims.c.config_key == config_key,
                    claims.c.fidelity == fidelity,
                )
            ).first()
        return str(row[0]) if row else None

    def worker_claims(self, study_name: str, worker: str) -> list[dict[str, Any]]:
        """The claims ``worker`` holds in the study (config_key, fidelity, trial_number ...)."""
        with self._connect() as conn:
            rows = conn.execute(
                sa.select(claims).where(claims.c.study_name == study_name, claims.c.worker == worker)
            ).all()
        return [dict(r._mapping) for r in rows]

    def release_claim(self, study_name: str, config_key: str, fidelity: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                sa.delete(claims).where(
                    claims.c.study_name == study_name,
                    claims.c.config_key == config_key,
                    claims.c.fidelity == fidelity,
                )
            )

    def record_probe(self, row: ProbeRow) -> int:
        """Stores one probe row (its ``study_name`` set); returns its id."""
        if row.study_name is None:
            raise ValueError("a probe row is stored under its study: set ProbeRow.study_name")
        values = {"created_at": now(), **row.to_record()}
        with self.engine.begin() as conn:
            res = conn.execute(sa.insert(probes).values(**values))
            return int(_primary_key(res))

    def probes(
        self,
        study_name: str,
        *,
        fidelity: str | None = None,
        status: str | None = None,
        offset: int = 0,
        limit: int | None = None,
    ) -> list[ProbeRow]:
        """The study's probe rows in the order they were stored (optionally one fidelity or status, a page)."""
        q = sa.select(probes).where(probes.c.study_name == study_name)
        if fidelity is not None:
            q = q.where(probes.c.fidelity == fidelity)
        if status is not None:
            q = q.where(probes.c.status == status)
        q = q.order_by(probes.c.id).offset(offset)
        if limit is not None:
            q = q.limit(limit)
        with self._connect() as conn:
            rows = conn.execute(q).all()
        return [ProbeRow.from_record(dict(r._mapping)) for r in rows]

    # -- reads for pages (the API): one indexed query each, whatever the size of the study ----------------------------
    def study_row(self, name: str) -> dict[str, Any] | None:
        """One study's row (name, created_at, created_by, definition), or None."""
        with self._connect() as conn:
            row = conn.execute(sa.select(studies).where(studies.c.name == name)).first()
        return dict(row._mapping) if row else None

    def probes_of_trials(self, study_name: str, trial_numbers: list[int]) -> list[ProbeRow]:
        """The probe rows of these trials (a page of them), in the order they were stored."""
        if not trial_numbers:
            return []
        q = (
            sa.select(probes)
            .where(probes.c.study_name == study_name, probes.c.trial_number.in_(sorted(set(trial_numbers))))
            .order_by(probes.c.id)
        )
        with self._connect() as conn:
            rows = conn.execute(q).all()
        return [ProbeRow.from_record(dict(r._mapping)) for r in rows]

    def count_probes(self, study_name: str) -> dict[str, int]:
        """Probe counts by status (ok, oom, timeout, error, inferred-oom ...)."""
        q = (
            sa.select(probes.c.status, sa.func.count())
            .where(probes.c.study_name == study_name)
            .group_by(probes.c.status)
        )
        with self._connect() as conn:
            return {status: int(n) for status, n in conn.execute(q).all()}

    def _connect(self) -> sa.Connection:
        try:
            return self.engine.connect()
        except OperationalError as err:
            raise _unreachable(self.url, err) from None
