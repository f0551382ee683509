"""SQLite inline: one ``sqlite3`` connection, statements run on the calling thread.

A WAL commit with ``synchronous=NORMAL`` takes ~20 µs — less than one hop to a driver
thread — so running each statement right on the event loop's thread is both the fastest
and the simplest path (a deliberate blocking call, allow-listed in the tests' guard). It
holds no event-loop objects, so one instance works across successive ``asyncio.run()``.

What must never block the loop is a *wait*: the connection's own busy timeout is zero,
and a statement that finds another process's write lock is retried with an async backoff
(:meth:`InlineSqlite._retry`) until the configured ``busy_timeout`` has passed. WAL
checkpoints (the only fsyncs under NORMAL) run on a background thread every
:attr:`~InlineSqlite.CHECKPOINT_EVERY` commits, and :meth:`~InlineSqlite.close` joins that
thread and closes the connection (which checkpoints) off the loop.

With ``writer_process`` (opt-in), while several runs of one loop write at once (a batch), every
write goes to a writer process instead (:mod:`.sqlite_writer`: SQLite's work on the other core); the reads stay here.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import threading
import time
import weakref
from typing import Any, Callable, Optional, Sequence, TypeVar

from ...errors import PersistenceError
from . import sqlite_tx as tx
from .errors import is_busy, wrap
from .loops import at_shutdown
from .schema import SqliteDb, ensure_schema
from .sqlite_tx import Op
from .sqlite_writer import SqliteWriter, writer_possible
from .statements import statements

__all__ = ["InlineSqlite", "sqlite_pragmas", "Busy"]

log = logging.getLogger("we0nb.persistence.sql")

T = TypeVar("T")
_SQL = statements("sqlite")


class Busy(Exception):
    """Another connection holds the write lock: try again later (never escapes this package)."""

    def __init__(self, error: sqlite3.Error):
        super().__init__(str(error))
        self.error = error


def sqlite_pragmas(dbapi_conn: Any, synchronous: str, busy_ms: int) -> None:
    """WAL, ``synchronous`` and the busy timeout: the settings of every we0nb SQLite connection."""
    cur = dbapi_conn.cursor()
    try:
        cur.execute(f"PRAGMA busy_timeout = {busy_ms}")
        try:
            cur.execute("PRAGMA journal_mode = WAL")
        except Exception:  # on purpose: a read-only database cannot switch; a write will say so clearly
            pass
        cur.execute(f"PRAGMA synchronous = {synchronous}")
    finally:
        cur.close()


class InlineSqlite:
    """The :class:`~.statements` run on one ``sqlite3`` connection (opened lazily)."""

    #: commits between WAL checkpoints (a few thousand WAL pages: each checkpoint fsyncs)
    CHECKPOINT_EVERY = 1000
    #: the longest single async back-off sleep while the database is locked (seconds)
    MAX_BACKOFF = 0.025

    def __init__(self, database: str, uri: bool, synchronous: str, busy_timeout: float, where: str,
                 writer_process: bool = False):
        self.database, self.uri, self.where = database, uri, where
        self.synchronous, self.busy_timeout = synchronous, busy_timeout
        self.lock = threading.RLock()  # the checkpoint thread and close() use the connection too
        self.conn: Optional[sqlite3.Connection] = None
        self.wal = False
        self.commits = 0
        self.ckpt_wake = threading.Event()
        self.ckpt_thread: Optional[threading.Thread] = None
        self.ckpt_stop = False
        # the writer process of each event loop (sqlite_writer.py), and the loops that want one
        self.offload = writer_process and writer_possible()
        self.writers: dict[asyncio.AbstractEventLoop, SqliteWriter] = {}
        self.wanted: dict[asyncio.AbstractEventLoop, "asyncio.Task[None]"] = {}
        self.shutdown_guards: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()

    # ------------------------------------------------------------------ the async interface

    async def execute(self, key: str, params: dict[str, Any]) -> int:
        """One statement, committed (autocommit); returns its row count."""
        return await self._write(("execute", (key, params)), self._execute, key, params)

    async def fetchall(self, key: str, params: dict[str, Any]) -> list[Any]:
        return await self._retry(self._fetchall, key, params)

    async def transaction(self, ops: Sequence[Op], guard: Optional[Op] = None) -> bool:
        """``ops`` in one transaction. ``guard``: a statement run first that must change one row,
        else nothing is written and the result is False."""
        commits = [(ops, guard)]
        return (await self._write(commits, self._together, commits))[0]

    commit = transaction  # a run's commit (alone; runs that write at once go through sqlite_group.py)

    async def together(self, commits: Sequence[tx.Commit]) -> list[bool]:
        """Several ``(ops, guard)`` commits in one transaction: for each, whether it was written
        (its guard changed one row). An error writes none of them."""
        return await self._write(list(commits), self._together, commits)

    async def statements(self, queries: Sequence[tuple[str, dict[str, Any], bool]]) -> list[Any]:
        """``(key, params, rows)`` statements in one transaction: each one's rows (``rows``) or row count."""
        return await self._write(("statements", queries), self._statements, queries)

    def together_now(self, commits: Sequence[tx.Commit]) -> list[bool]:
        """:meth:`together` at once, on this thread; raises :class:`Busy` when the database is locked."""
        return self._call(self._together, commits)

    def fetch_now(self, queries: Sequence[Op]) -> Optional[list[list[Any]]]:
        """Several reads at once, synchronously; None when the database is locked (use the async path)."""
        try:
            return self._call(lambda conn: [conn.execute(_SQL[k], p).fetchall() for k, p in queries])
        except Busy:
            return None

    async def close(self) -> None:
        """Stop the writer process, the checkpoint thread and the connection, all off the event loop."""
        await self.stop_writer()
        if self.ckpt_thread is None and self.conn is None:
            return
        await asyncio.to_thread(self.close_now)

    def close_now(self) -> None:
        thread = self.ckpt_thread
        if thread is not None:
            self.ckpt_stop = True
            self.ckpt_wake.set()
            thread.join(timeout=30)
            self.ckpt_thread = None
            self.ckpt_stop = False
        with self.lock:
            if self.conn is not None:
                self.conn.close()  # the last connection checkpoints and removes the WAL
                self.conn = None

    # ------------------------------------------------------------------ the writer process

    def writer(self) -> Optional[SqliteWriter]:
        """The running loop's writer process, when it has one that takes requests."""
        if not self.writers:
            return None
        w = self.writers.get(asyncio.get_running_loop())
        return w if w is not None and w.usable else None

    def want_writer(self) -> None:
        """Several runs of the running loop write at once: start its writer process (once)."""
        if not self.offload:
            return
        loop = asyncio.get_running_loop()
        if loop not in self.wanted:
            self.wanted[loop] = loop.create_task(self._start_writer(loop))

    async def stop_writer(self) -> None:
        """The running loop no longer needs its writer: it answers what it has, then ends."""
        loop = asyncio.get_running_loop()
        starting = self.wanted.pop(loop, None)
        if starting is not None and not starting.done():
            await asyncio.shield(starting)  # (it sees that it is no longer wanted, and stops)
        w = self.writers.pop(loop, None)
        if w is not None:
            await w.stop()

    async def _start_writer(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            files = self._call(lambda conn: conn.execute("PRAGMA database_list").fetchall())
            file = next((f for _, name, f in files if name == "main"), "")
            if not file:  # a temporary or in-memory database: only this connection sees it
                self.offload = False
                return
            config = {"database": file, "uri": False, "synchronous": self.synchronous,
                      "busy_timeout": self.busy_timeout, "sql": dict(_SQL)}
            w = await SqliteWriter.start(config, self.where)
        except Exception as e:  # on purpose: the writes stay on this thread, as for a run alone
            log.warning("SQLite writes stay on the event loop's thread: no writer process (%s)", e)
            self.offload = False
            return
        if self.wanted.get(loop) is not asyncio.current_task():  # stopped while it started
            await w.stop()
            return
        self.writers[loop] = w
        await at_shutdown(loop, self.shutdown_guards, self.stop_writer)  # if the loop ends first

    # ------------------------------------------------------------------ running a statement

    async def _write(self, request: Any, fn: Callable[..., T], *args: Any) -> T:
        """A write: at the running loop's writer process when it has one (``request``, see
        :mod:`.sqlite_writer_process`), else ``fn(conn, *args)`` here."""
        w = self.writer()
        if w is None:
            return await self._retry(fn, *args)
        out: T = await w.call(request)
        self._committed()
        return out

    async def _retry(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(conn, *args)`` now; while the database is locked, again after an async sleep."""
        try:
            return self._call(fn, *args)
        except Busy:
            pass
        deadline = time.monotonic() + self.busy_timeout
        delay = 0.0005
        while True:
            await asyncio.sleep(delay)
            try:
                return self._call(fn, *args)
            except Busy as b:
                if time.monotonic() >= deadline:
                    raise wrap(b.error, self.where) from b.error
            delay = min(delay * 2, self.MAX_BACKOFF)

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """The one place inline statements run: on this thread, errors as PersistenceError or Busy."""
        with self.lock:
            try:
                conn = self.conn or self._open()
                return fn(conn, *args)
            except sqlite3.Error as e:
                if is_busy(e):
                    raise Busy(e) from None
                raise wrap(e, self.where) from e

    def _execute(self, conn: sqlite3.Connection, key: str, params: dict[str, Any]) -> int:
        n = tx.execute(conn, _SQL, key, params)
        self._committed()
        return n

    @staticmethod
    def _fetchall(conn: sqlite3.Connection, key: str, params: dict[str, Any]) -> list[Any]:
        return conn.execute(_SQL[key], params).fetchall()

    def _together(self, conn: sqlite3.Connection, commits: Sequence[tx.Commit]) -> list[bool]:
        out = tx.together(conn, _SQL, commits)
        self._committed()
        return out

    def _statements(self, conn: sqlite3.Connection, queries: Sequence[tuple[str, dict[str, Any], bool]]) -> list[Any]:
        out = tx.statements(conn, _SQL, queries)
        self._committed()
        return out

    # ------------------------------------------------------------------ opening

    def _open(self) -> sqlite3.Connection:
        if not self.uri and self.database not in ("", ":memory:"):
            folder = os.path.dirname(os.path.abspath(self.database))
            if not os.path.isdir(folder):
                raise PersistenceError(
                    f"Cannot open the SQLite database {self.where}: the folder {folder!r} does not exist."
                )
        try:
            conn = sqlite3.connect(self.database, uri=self.uri, isolation_level=None,
                                   check_same_thread=False, timeout=0)
        except sqlite3.Error as e:
            raise wrap(e, self.where) from e
        try:
            sqlite_pragmas(conn, self.synchronous, 0)  # never wait on the loop: _retry waits
            self.wal = conn.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal"
            if self.wal:
                # checkpoints (which fsync) run on a background thread, not in a commit
                conn.execute("PRAGMA wal_autocheckpoint = 0")
            ensure_schema(SqliteDb(conn, self.where))
            self._probe_writable(conn)
        except BaseException:
            conn.close()
            raise
        self.conn = conn
        self.commits = 0
        return conn

    @staticmethod
    def _probe_writable(conn: sqlite3.Connection) -> None:
        """Fail at open, not at the first write in the middle of a run, when the file is read-only."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(_SQL["write_probe"], {"key": "write_probe", "value": ""})
        finally:
            conn.execute("ROLLBACK")

    # ------------------------------------------------------------------ WAL checkpoints off the loop

    def _committed(self) -> None:
        self.commits += 1
        if self.commits >= self.CHECKPOINT_EVERY and self.wal:
            self.commits = 0
            if self.ckpt_thread is None or not self.ckpt_thread.is_alive():
                self.ckpt_thread = threading.Thread(target=self._checkpointer, name="we0nb-sqlite-checkpoint",
                                                    daemon=True)
                self.ckpt_thread.start()
            self.ckpt_wake.set()

    def _checkpointer(self) -> None:
        busy_ms = int(self.busy_timeout * 1000)  # this thread may wait: it is not the loop's
        try:
            conn = sqlite3.connect(self.database, uri=self.uri, isolation_level=None, check_same_thread=False,
                                   timeout=self.busy_timeout)
        except sqlite3.Error:  # pragma: no cover - the writer's connection opened just fine
            return
        try:
            sqlite_pragmas(conn, self.synchronous, busy_ms)
            while True:
                self.ckpt_wake.wait()
                self.ckpt_wake.clear()
                if self.ckpt_stop:
                    return
                try:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
                except sqlite3.Error as e:  # busy or read-only: the next round tries again
                    log.debug("WAL checkpoint skipped: %s", e)
        finally:
            conn.close()
