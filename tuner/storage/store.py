"""Reads and writes of the project's own tables. One small class, one concept: what was probed and by whom."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError, OperationalError

from tuner.errors import StorageError, StudyNotFound
from tuner.records import ProbeRow
from tuner.records.run import Claim, RunStatus, SearchRun
from tuner.records.study import StudyDefinition, StudyRecord
from tuner.settings import redact
from tuner.storage.db import _unreachable, ensure_schema, open_for_reading
from tuner.storage.faults import first_line
from tuner.storage.schema import claims, probes, search_runs, studies
from tuner.storage.utc import UTCDateTime


def _primary_key(res: sa.CursorResult[Any]) -> int:
    key = res.inserted_primary_key
    assert key is not None, "an INSERT of one row returns its primary key"
    return int(key[0])


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def db_time(dialect: str) -> sa.ColumnElement[Any]:
    """The database's own clock, as a SQL expression: what claims, heartbeats and liveness are measured on, so that
    workers on hosts whose wall clocks disagree still agree on who is stale. SQLite (a file on this host) gives its
    time in SQLAlchemy's own DateTime text format (microseconds), so stored values compare as the Python ones did."""
    if dialect == "sqlite":
        return sa.func.strftime("%Y-%m-%d %H:%M:%f000", "now")
    return sa.func.now()


class Store:
    def __init__(self, url: str, *, read_only: bool = False) -> None:
        """``read_only``: a read command's store, refused on a database without tuner's tables instead of creating
        them there (tuner.storage.db.open_for_reading)."""
        self.url = url
        self.engine = open_for_reading(url) if read_only else ensure_schema(url)

    def _now(self) -> sa.ColumnElement[Any]:
        return db_time(self.engine.dialect.name)

    def db_now(self) -> dt.datetime:
        """The database's clock now (UTC): the ``now`` to judge claims and heartbeats by (SearchRun.is_live)."""
        with self._connect() as conn:
            return conn.execute(sa.select(sa.type_coerce(self._now(), UTCDateTime()))).scalar_one()

    # -- studies ---------------------------------------------------------------------------------------------------
    def ensure_study(self, name: str, definition: dict[str, Any], created_by: str = "cli") -> dict[str, Any]:
        """Returns the stored definition of ``name``, creating it from ``definition`` when new."""
        return self.create_study(name, definition, created_by)[0]

    def create_study(
        self, name: str, definition: dict[str, Any], created_by: str = "cli"
    ) -> tuple[dict[str, Any], bool]:
        """(the stored definition of ``name``, whether this call created it). Two workers creating one study at once:
        the unique name lets one INSERT win; the other gets the winner's definition and False, and must check it
        against its own (tuner.search.request.check_resume) instead of assuming its own was stored."""
        existing = self.study_definition(name)
        if existing is not None:
            return existing, False
        try:
            with self.engine.begin() as conn:
                conn.execute(
                    sa.insert(studies).values(
                        name=name, created_at=self._now(), definition=definition, created_by=created_by
                    )
                )
        except IntegrityError as err:  # another worker created it first, or the database refused the row
            stored = self.study_definition(name)
            if stored is None:
                raise StorageError(
                    f"storage refused the study {name!r} ({redact(first_line(err), self.url)}); fix the database "
                    "(space, permissions, a writable primary) and re-run"
                ) from None
            return stored, False
        return definition, True

    def study_definition(self, name: str) -> dict[str, Any] | None:
        with self._connect() as conn:
            row = conn.execute(sa.select(studies.c.definition).where(studies.c.name == name)).first()
        return dict(row[0]) if row else None

    def record_in_definition(self, name: str, key: str, value: Any) -> Any:
        """Sets ``key`` of the stored definition of ``name`` to ``value`` unless it has one; returns the value stored
        then (``value``, or the one another worker stored first). A compare-and-swap on the definition's stored text
        (JSON has no equality operator in PostgreSQL), so two workers recording at once keep one value."""
        text = sa.cast(studies.c.definition, sa.Text)
        for _ in range(10):
            with self._connect() as conn:
                row = conn.execute(sa.select(text).where(studies.c.name == name)).first()
            if row is None:
                self.require_study(name)  # the one "no study named ..." line
            assert row is not None
            current = json.loads(row[0])
            if current.get(key) is not None:
                return current[key]
            with self.engine.begin() as conn:
                res = conn.execute(
                    sa.update(studies)
                    .where(studies.c.name == name, text == row[0])
                    .values(definition={**current, key: value})
                )
            if res.rowcount == 1:
                return value
        raise StorageError(f"study {name!r}: its definition kept changing while {key!r} was recorded; try again")

    def studies(self) -> list[StudyRecord]:
        """All studies, newest first, as typed records (RecordError names a broken definition)."""
        with self._connect() as conn:
            rows = conn.execute(sa.select(studies).order_by(studies.c.created_at.desc(), studies.c.id.desc())).all()
        return [StudyRecord.from_record(dict(r._mapping)) for r in rows]

    def require_study(self, name: str) -> dict[str, Any]:
        """The stored definition's JSON, as written (what a resumed study is compared with: check_resume)."""
        definition = self.study_definition(name)
        if definition is None:
            raise StudyNotFound(f"no study named {name!r} in this storage; `tuner studies` lists the known ones")
        return definition

    def definition(self, name: str) -> StudyDefinition | None:
        """The study's definition as a typed record (built once here, its invariants checked), or None."""
        stored = self.study_definition(name)
        return StudyDefinition.from_json(stored, name) if stored is not None else None

    def require_definition(self, name: str) -> StudyDefinition:
        """As ``definition``; StudyNotFound (one line) for an unknown study."""
        return StudyDefinition.from_json(self.require_study(name), name)

    # -- search runs -----------------------------------------------------------------------------------------------
    def start_run(self, study_name: str, worker: str, budget_s: float | None, deadline: dt.datetime | None) -> int:
        with self.engine.begin() as conn:
            res = conn.execute(
                sa.insert(search_runs).values(
                    study_name=study_name,
                    worker=worker,
                    started_at=self._now(),
                    heartbeat_at=self._now(),
                    deadline_at=deadline,
                    budget_s=budget_s,
                    status=RunStatus.RUNNING.value,
                )
            )
            return int(_primary_key(res))

    def heartbeat(self, run_id: int) -> None:
        """A write (the run's beat, on the database's clock): it fails when the database takes no writes, where a
        read would pass."""
        with self.engine.begin() as conn:
            res = conn.execute(
                sa.update(search_runs).where(search_runs.c.id == run_id).values(heartbeat_at=self._now())
            )
            if res.rowcount != 1:
                raise StorageError(f"search run {run_id} is gone from the storage; was the database reset?")

    def finish_run(self, run_id: int, status: RunStatus | str, message: str | None = None) -> None:
        """Marks the run ended with ``status`` (a RunStatus or its value: anything else is refused, ValueError, before
        it reaches the table)."""
        with self.engine.begin() as conn:
            conn.execute(
                sa.update(search_runs)
                .where(search_runs.c.id == run_id)
                .values(status=RunStatus(status).value, message=message, finished_at=self._now())
            )

    def runs(self, study_name: str) -> list[SearchRun]:
        """The study's search runs, oldest first."""
        with self._connect() as conn:
            rows = conn.execute(
                sa.select(search_runs).where(search_runs.c.study_name == study_name).order_by(search_runs.c.id)
            ).all()
        return [SearchRun.from_record(dict(r._mapping)) for r in rows]

    # -- claims and probes -----------------------------------------------------------------------------------------
    def _claim_where(self, study_name: str, config_key: str, fidelity: str) -> sa.ColumnElement[bool]:
        return sa.and_(
            claims.c.study_name == study_name, claims.c.config_key == config_key, claims.c.fidelity == fidelity
        )

    def claim(self, study_name: str, config_key: str, fidelity: str, trial_number: int | None, worker: str) -> bool:
        """True when ``worker`` now owns (config_key, fidelity) in the study, also when it already did (its own claim,
        e.g. the INSERT committed but its answer was lost); False when another worker owns it."""
        try:
            with self.engine.begin() as conn:
                conn.execute(
                    sa.insert(claims).values(
                        study_name=study_name,
                        config_key=config_key,
                        fidelity=fidelity,
                        trial_number=trial_number,
                        worker=worker,
                        claimed_at=self._now(),
                    )
                )
        except IntegrityError:
            with self.engine.begin() as conn:
                res = conn.execute(
                    sa.update(claims)
                    .where(self._claim_where(study_name, config_key, fidelity), claims.c.worker == worker)
                    .values(trial_number=trial_number)
                )
                return res.rowcount == 1
        return True

    def take_over_claim(
        self, study_name: str, config_key: str, fidelity: str, stale: str, worker: str, trial_number: int | None
    ) -> bool:
        """Moves the claim from the gone worker ``stale`` to ``worker``, as a compare-and-swap: True only for the one
        worker whose UPDATE still found ``stale`` there (rowcount 1); any other taking over at the same time gets
        False, and the claim it did not win is left alone."""
        with self.engine.begin() as conn:
            res = conn.execute(
                sa.update(claims)
                .where(self._claim_where(study_name, config_key, fidelity), claims.c.worker == stale)
                .values(worker=worker, trial_number=trial_number, claimed_at=self._now())
            )
            return res.rowcount == 1

    def claim_owner(self, study_name: str, config_key: str, fidelity: str) -> str | None:
        """The worker holding the claim on (config_key, fidelity), or None."""
        with self._connect() as conn:
            row = conn.execute(
                sa.select(claims.c.worker).where(self._claim_where(study_name, config_key, fidelity))
            ).first()
        return str(row[0]) if row else None

    def worker_claims(self, study_name: str, worker: str) -> list[Claim]:
        """The claims ``worker`` holds in the study."""
        with self._connect() as conn:
            rows = conn.execute(
                sa.select(claims).where(claims.c.study_name == study_name, claims.c.worker == worker)
            ).all()
        return [Claim.from_record(dict(r._mapping)) for r in rows]

    def release_claim(self, study_name: str, config_key: str, fidelity: str, worker: str) -> bool:
        """Drops ``worker``'s claim on (config_key, fidelity); a claim another worker holds is left alone. True when
        one was dropped."""
        with self.engine.begin() as conn:
            res = conn.execute(
                sa.delete(claims).where(self._claim_where(study_name, config_key, fidelity), claims.c.worker == worker)
            )
            return res.rowcount == 1

    def record_probe(self, row: ProbeRow, uid: str | None = None) -> int:
        """Stores one probe row (its ``study_name`` set); returns its id. With ``uid`` (the journal's key) it is
        idempotent: a row already stored under ``uid`` is not stored again, and its id is returned."""
        if row.study_name is None:
            raise ValueError("a probe row is stored under its study: set ProbeRow.study_name")
        values = {"created_at": self._now(), **row.to_record(), "record_uid": uid}
        try:
            with self.engine.begin() as conn:
                res = conn.execute(sa.insert(probes).values(**values))
                return int(_primary_key(res))
        except IntegrityError:
            found = self.probe_id(uid) if uid is not None else None
            if found is None:
                raise
            return found

    def probe_id(self, uid: str) -> int | None:
        """The id of the row stored under the journal key ``uid``, or None."""
        with self._connect() as conn:
            found = conn.execute(sa.select(probes.c.id).where(probes.c.record_uid == uid)).scalar()
        return int(found) if found is not None else None

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
    def study(self, name: str) -> StudyRecord | None:
        """One study (name, created_at, created_by, its typed definition), or None."""
        with self._connect() as conn:
            row = conn.execute(sa.select(studies).where(studies.c.name == name)).first()
        return StudyRecord.from_record(dict(row._mapping)) if row else None

    def probes_of_trials(self, study_name: str, trial_numbers: list[int]) -> list[ProbeRow]:
        """The probe rows of these trials (a page of them), in the order they were stored. Read on the (study_name,
        trial_number) index and sorted here: an ORDER BY id in SQL made SQLite scan the study's rows in id order."""
        if not trial_numbers:
            return []
        q = sa.select(probes).where(
            probes.c.study_name == study_name, probes.c.trial_number.in_(sorted(set(trial_numbers)))
        )
        with self._connect() as conn:
            rows = sorted(conn.execute(q).all(), key=lambda r: int(r.id))
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

    def probe_version(self, study_name: str) -> tuple[int, int | None]:
        """(row count, highest id) of the study's probe rows: rows are insert-only (record_probe), so this names their
        content, in one indexed aggregate (what the API's caches are keyed on)."""
        q = sa.select(sa.func.count(), sa.func.max(probes.c.id)).where(probes.c.study_name == study_name)
        with self._connect() as conn:
            count, top = conn.execute(q).one()
        return int(count), top

    def ping(self) -> None:
        """One round trip to the database; raises StorageError when it does not answer."""
        try:
            with self._connect() as conn:
                conn.execute(sa.select(sa.literal(1))).scalar_one()
        except OperationalError as err:
            raise _unreachable(self.url, err) from None

    def _connect(self) -> sa.Connection:
        try:
            return self.engine.connect()
        except OperationalError as err:
            raise _unreachable(self.url, err) from None
