"""Fixtures shared by the engine tests."""

import pytest

from we0nb import MemoryPersistence


@pytest.fixture(params=["memory", "sqlite"])
async def store(request, tmp_path):
    """Each test runs on both a MemoryPersistence and a SqlPersistence on a SQLite file."""
    if request.param == "memory":
        yield MemoryPersistence()
        return
    from we0nb.persistence.sql import SqlPersistence

    p = SqlPersistence(f"sqlite:///{tmp_path / 'we0.db'}")
    yield p
    await p.close()
