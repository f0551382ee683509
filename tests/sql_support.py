"""Helpers shared by the SQL persistence tests: the PostgreSQL URL and throw-away schemas.

PostgreSQL tests read ``WE0NB_TEST_POSTGRES_URL`` (``.ci/run`` sets it to
``postgresql://postgres@127.0.0.1:5432/test``) and skip with that reason when it is unset.
Every test gets its own schema ``we0test_<random>``, dropped afterwards, so parallel runs
(``pytest -n 2``) never see each other's rows.
"""

from __future__ import annotations

import os
import uuid
from typing import Iterator, Optional

import pytest

PG_ENV = "WE0NB_TEST_POSTGRES_URL"
PG_URL: Optional[str] = os.environ.get(PG_ENV) or None
PG_SKIP_REASON = f"{PG_ENV} is not set: PostgreSQL tests need a server (.ci/run sets it)"


def _libpq(url: str) -> str:
    # psycopg.connect wants a libpq URL, not a SQLAlchemy one
    return url.replace("postgresql+psycopg://", "postgresql://").replace("postgresql+psycopg_async://", "postgresql://")


def create_schema() -> str:
    import psycopg

    assert PG_URL is not None
    name = f"we0test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(_libpq(PG_URL), autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
    return name


def drop_schema(name: str) -> None:
    import psycopg

    assert PG_URL is not None
    with psycopg.connect(_libpq(PG_URL), autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def pg_execute(schema: str, sql: str, params: tuple = ()) -> list[tuple]:
    """Run one statement in ``schema`` (autocommit) and return its rows, if any."""
    import psycopg

    assert PG_URL is not None
    with psycopg.connect(_libpq(PG_URL), autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        cur = conn.execute(sql, params)
        return cur.fetchall() if cur.description else []


@pytest.fixture
def pg_schema() -> Iterator[str]:
    if PG_URL is None:
        pytest.skip(PG_SKIP_REASON)
    name = create_schema()
    try:
        yield name
    finally:
        drop_schema(name)


def sqlite_raw(path):
    """A function that runs one SQL statement on the SQLite file ``path`` and returns its rows."""
    import sqlite3

    def raw(sql: str) -> list:
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            return conn.execute(sql).fetchall()
        finally:
            conn.close()

    return raw
