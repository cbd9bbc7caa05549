"""Where the tests' PostgreSQL is: the real server at 127.0.0.1:5432 (CI), or the throwaway cluster scripts/test.sh
starts when none answers (TUNER_TEST_PG_ADMIN then names it)."""

from __future__ import annotations

import os

PG_ADMIN = os.environ.get("TUNER_TEST_PG_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres")
PG_HOST = PG_ADMIN.rsplit("/", 1)[0].split("://", 1)[1]  # user@host:port


def admin_exec(sql: str) -> None:
    import psycopg

    with psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=5) as conn:
        conn.execute(sql)
