"""Fixtures shared by the engine tests, and the guard against blocking calls on the event loop."""

from __future__ import annotations

import os
import traceback
from pathlib import Path
from typing import Any, Iterator

import pytest

# On Python 3.11.7 (these machines' 3.11) a test session sometimes ended with "SystemError: AST
# constructor recursion depth mismatch" (a CPython bug in the AST's recursion check, fixed in later
# 3.11 releases): the hypothesis plugin imports hypothesis at the session's end, through pytest's
# assertion rewriter (an ``ast.parse``), after the tests left that check's counter off (tests/
# test_sqlite_wal.py alone: 5 of 14 runs). Imported here, at the start, it is loaded by then
# (0 of 6 runs after).
import hypothesis  # noqa: E402,F401

from sql_support import SQL_STORES, Backend, backend_for

# --------------------------------------------------------------------------- stores
# One fixture per role, each parametrized by the test's module: ``store`` (a store) and ``backend``
# (a :class:`sql_support.Backend`: stores on one database, and raw SQL on it) run on the module's
# ``STORES`` (by default a MemoryPersistence and a SqlPersistence on a SQLite file); ``sql`` on its
# ``SQL_STORES`` (by default every SQL store of sql_support); ``pg`` is PostgreSQL alone. A module
# that defines a fixture of the same name keeps its own.

#: the stores of ``store`` and ``backend`` unless the module names others (``STORES``)
DEFAULT_STORES = ["memory", "sqlite"]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    for name, attr, default in (("store", "STORES", DEFAULT_STORES), ("backend", "STORES", DEFAULT_STORES),
                                ("sql", "SQL_STORES", SQL_STORES)):
        if name in metafunc.fixturenames and not hasattr(metafunc.module, name):
            metafunc.parametrize(name, getattr(metafunc.module, attr, default), indirect=True)


@pytest.fixture
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    yield from backend_for(request.param, tmp_path)


@pytest.fixture
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    for b in backend_for(request.param, tmp_path):
        yield b.fresh()


@pytest.fixture
def sql(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    yield from backend_for(request.param, tmp_path)


@pytest.fixture
def pg(tmp_path: Path) -> Iterator[Backend]:
    yield from backend_for("postgres", tmp_path)


# --------------------------------------------------------------------------- the blocking-call guard
# Issue 13, defect 12: nothing in we0nb may block the event loop (sleep, wait for a lock, file
# or socket I/O) except the calls allowed below on purpose. ``blockbuster`` (as pydantic-ai's
# tests use it) patches the blocking functions while a test runs; a call made on a running
# loop's thread with a we0nb frame on the stack raises BlockingError — and is recorded, so a
# BlockingError that we0nb code catches and swallows still fails the test.

#: test modules that run under the guard. Not yet: test_openai_model (the first stream imports
#: openai/httpx on the loop, which reads package metadata from disk) and test_cli (the CLI
#: stats the database path on the loop); the notebook layer's tests are the frames' work.
GUARDED_MODULES = {
    "test_sql_persistence", "test_sql_reliability", "test_model_views",
    "test_engine_run", "test_engine_abort", "test_engine_resume", "test_engine_property", "test_step_commits",
    "test_compaction", "test_revert", "test_recovery_plan", "test_crash_matrix", "test_messages", "test_tools",
    "test_build_request", "test_batch", "test_store_conformance", "test_cost", "test_tracing", "test_sqlite_wal",
}

#: deliberate blocking calls: (file, functions, the blockbuster functions they may call, why)
ALLOWED = [
    ("we0nb/persistence/sql/inline.py", {"_call"}, ("sqlite3.", "os.stat", "os.path.abspath"),
     "inline SQLite runs each statement on the loop's thread on purpose: a WAL commit costs ~20 µs, less "
     "than a hop to a thread (docs/persistence.md); it never *waits* there (busy timeout 0, async "
     "back-off). Opening stats the folder once."),
    ("we0nb/persistence/sql/engine.py", {"_new_engine"}, ("os.path.abspath",),
     "SQLAlchemy makes a SQLite file name absolute when an async engine is created (once per event loop)"),
    ("logging/__init__.py", {"emit", "flush"}, ("io.TextIOWrapper.write", "io.BufferedWriter.write"),
     "a logged warning goes to the handlers the application configured (a QueueHandler never blocks)"),
    ("we0nb/persistence/conformance/harness.py", {"fresh"}, ("os.path.abspath",),
     "the conformance harness makes a store with the test's factory: an AsyncEngine made there resolves its "
     "SQLite file name (the test's own setup, as when a test makes it directly)"),
    ("we0nb/persistence/sql/lease.py", {"pid_alive"}, ("io.BufferedReader.read",),
     "reads /proc/<pid>/stat when taking over a lease: procfs is served from kernel memory, never a disk"),
]


def _allow(bb: Any) -> None:
    for filename, functions, prefixes, _why in ALLOWED:
        for name, fn in bb.functions.items():
            if name.startswith(prefixes):
                fn.can_block_in(filename, functions)


@pytest.fixture(autouse=True)
def blocking_guard(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    if request.module.__name__ not in GUARDED_MODULES:
        yield None
        return
    from blockbuster import blockbuster as bbmod
    from blockbuster import blockbuster_ctx

    found: list[str] = []

    class RecordedBlockingError(bbmod.BlockingError):
        def __init__(self, func: str) -> None:
            super().__init__(func)
            found.append(f"{func}\n" + "".join(traceback.format_stack(limit=40)[:-1]))

    monkeypatch.setattr(bbmod, "BlockingError", RecordedBlockingError)
    with blockbuster_ctx("we0nb") as bb:
        _allow(bb)
        yield bb
    assert not found, "blocking calls on the event loop:\n\n" + "\n\n".join(found)


@pytest.fixture(autouse=True)
def one_browser_at_a_time(request: pytest.FixtureRequest) -> Iterator[None]:
    """Tests marked ``browser`` take turns (see ``nbutil_lab.browser_slot``)."""
    if request.node.get_closest_marker("browser") is None:
        yield None
        return
    from nbutil_lab import browser_slot

    with browser_slot():
        yield None


@pytest.fixture
def artifacts() -> Path:
    """Where tests leave screenshots and logs for a person to look at (``WE0NB_ARTIFACTS``)."""
    d = Path(os.environ.get("WE0NB_ARTIFACTS", "test-artifacts"))
    d.mkdir(parents=True, exist_ok=True)
    return d
