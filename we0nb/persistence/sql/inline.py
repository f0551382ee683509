"""SQLite inline: one ``sqlite3`` connection, statements run on the calling thread.

A WAL commit with ``synchronous=NORMAL`` takes ~20 µs — less than one hop to a driver
thread — so running each statement right on the event loop's thread is both the fastest
and the simplest path (a deliberate blocking call, allow-listed in the tests' guard). It
holds no event-loop objects, so one instance works across successive ``asyncio.run()``.

What must never block the loop is a *wait*: the connection's own busy timeout is zero,
and a statement that finds another process's write lock is retried with an async backoff
(:meth:`InlineSqlite._retry`) until the configured ``busy_timeout`` has passed.

WAL checkpoints (the only fsyncs under NORMAL) run on a background thread, never in a commit
(automatic checkpoints are off). The WAL is kept bounded by its size, not by a count of
commits: the loop looks at the WAL's size (one ``stat``) once its own commits may have added
:attr:`~InlineSqlite.WAL_STRIDE` bytes since it last looked (a bound reckoned from each commit's
rows and their text, :func:`_bound`: no system call per commit); past
:attr:`~InlineSqlite.WAL_LIMIT` (or the database's own size, when larger, up to
:attr:`~InlineSqlite.WAL_CAP`) it wakes the thread. The thread copies what it can without
stopping anyone (a passive checkpoint), then runs a ``TRUNCATE`` one: it takes the write lock
(the loop's writers meanwhile back off asynchronously, as for another process's lock) only to
copy what was written since, and empties the file. So the WAL stays within about one database
plus a few MiB (and at most a few tens of MiB) whatever the batch's length — a passive checkpoint
alone never catches up with a busy writer: the file only grew — and writers wait for a
checkpoint of at most what the passive pass left, never of the whole WAL, retrying every
:attr:`~InlineSqlite.CKPT_BACKOFF` meanwhile (not a doubling sleep that would outlast it).
On a nearly full disk (less room left than four times the WAL: a checkpoint first copies the
WAL's pages into the database, so it needs room) the checkpoint is asked for at once and the
loop's writes give way to it until it ends (:meth:`~InlineSqlite._give_way`).
:meth:`~InlineSqlite.close` joins that thread and closes the connection (which checkpoints) off the loop.

While several runs of one loop commit at once (a batch), their commits go through
:mod:`.sqlite_group` (one transaction per pass of the loop) instead of one transaction each.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import threading
import time
from typing import Any, Callable, Iterator, Optional, Sequence, TypeVar

from ...errors import PersistenceError
from . import statements as q
from .driver import Call, Guard, Op, Params, held
from .database import sqlite_pragmas
from .errors import Busy, is_busy, wrap
from .readonly import read_only_fallback
from .schema import SqliteDb, ensure_schema
from .sqlite_group import SqliteGroup
from .sqlite_exec import execute, execute_many
from .statements import Stmt

__all__ = ["InlineSqlite"]

log = logging.getLogger("we0nb.persistence.sql")

T = TypeVar("T")
#: a commit: its ops, and the guard that must hold for them to be written
Commit = tuple[Sequence[Op], Optional[Guard]]


class InlineSqlite:
    """The SQLite driver (:class:`~.driver.Driver`): the statements run on one ``sqlite3`` connection
    (opened lazily) on the calling thread."""

    dialect = "sqlite"
    #: the WAL size (bytes) past which a checkpoint is asked for; the database's size when larger,
    #: up to WAL_CAP (a larger WAL makes each checkpoint longer: its pages are copied while writers wait)
    WAL_LIMIT = 4 * 1024 * 1024
    WAL_CAP = 16 * 1024 * 1024
    #: the size SQLite cuts the WAL file back to when it starts it again (``journal_size_limit``)
    WAL_KEEP = 4 * 1024 * 1024
    #: the WAL bytes this connection's commits may add before it looks at the WAL's size again (at
    #: most an eighth of the limit); each commit counts a bound of what it wrote (:func:`_bound`),
    #: so the WAL passes its limit by at most this much before a checkpoint is asked for
    WAL_STRIDE = 512 * 1024
    #: the room left on the WAL's disk, in WALs, under which a checkpoint is asked for at once and
    #: the loop's writes give way to it (it copies the WAL's pages into the database first)
    ROOM_PER_WAL = 4
    #: the bytes of a WAL frame per page written, for the bound (the page size + the frame header)
    FRAME = 4096 + 24
    #: the longest single async back-off sleep while the database is locked (seconds)
    MAX_BACKOFF = 0.025
    #: the back-off sleep while this connection's own checkpoint holds the write lock (seconds):
    #: short and not growing — it lasts a few milliseconds, and a doubling sleep would overshoot
    #: its end by as much again
    CKPT_BACKOFF = 0.0005

    def __init__(self, database: str, uri: bool, synchronous: str, busy_timeout: float, where: str):
        self.database, self.uri, self.where = database, uri, where
        self.synchronous, self.busy_timeout = synchronous, busy_timeout
        self.lock = threading.RLock()  # the checkpoint thread and close() use the connection too
        self.conn: Optional[sqlite3.Connection] = None
        self.wal = False
        self.wal_path = ""  # the WAL file ("": none to watch, e.g. an in-memory database)
        self.db_path = ""
        self.wal_limit = self.WAL_LIMIT
        self.unseen = 0  # the bound of the WAL bytes written since the WAL's size was last looked at
        self.room = self.WAL_LIMIT  # the disk's free bytes when the WAL's size was last looked at
        self.frame = self.FRAME
        self.checkpoints = 0  # how many checkpoints were asked for (the tests read it)
        self.ckpt_wake = threading.Event()
        self.ckpt_thread: Optional[threading.Thread] = None
        self.ckpt_stop = False
        self.ckpt_locking = False  # the checkpoint thread holds (or waits for) the write lock
        #: a checkpoint the disk's room needs is asked for or under way: the loop's writes wait for it
        self.ckpt_urgent = False
        self.group = SqliteGroup(self)

    # ------------------------------------------------------------------ the driver

    async def execute(self, stmt: Stmt, params: Params) -> int:
        """One statement, committed (autocommit); returns its row count."""
        return await self._retry(self._execute, stmt, params)

    async def fetchall(self, stmt: Stmt, params: Params) -> list[Any]:
        return await self._retry(self._fetchall, stmt, params)

    async def run(self, calls: Sequence[Call]) -> list[Any]:
        """Reads one after the other; calls that write in one transaction (one commit, not several)."""
        if all(rows for _, _, rows in calls):
            return [await self.fetchall(stmt, params) for stmt, params, _ in calls]
        return await self._retry(self._statements, calls)

    async def transaction(self, ops: Sequence[Op], guard: Optional[Guard] = None) -> bool:
        """``ops`` in one transaction, after ``guard`` (nothing written when it does not hold)."""
        return (await self._retry(self._together, [(ops, guard)]))[0]

    async def commit(self, ops: Sequence[Op], guard: Optional[Guard], *, crowded: bool) -> bool:
        """Alone: at once. ``crowded``: with the other runs' commits of this pass (:mod:`.sqlite_group`)."""
        if crowded:
            return await self.group.commit(ops, guard)
        return await self.transaction(ops, guard)

    async def together(self, commits: Sequence[Commit]) -> list[bool]:
        """Several ``(ops, guard)`` commits in one transaction: for each, whether it was written
        (its guard held). An error writes none of them."""
        return await self._retry(self._together, commits)

    def together_now(self, commits: Sequence[Commit]) -> list[bool]:
        """:meth:`together` at once, on this thread; raises :class:`Busy` when the database is locked."""
        return self._call(self._together, commits)

    def read_now(self, queries: Sequence[tuple[Stmt, Params]]) -> Optional[list[list[Any]]]:
        """Several reads at once, synchronously; None when the database is locked (use the async path)."""
        try:
            return self._call(lambda conn: [execute(conn, k, p).fetchall() for k, p in queries])
        except Busy:
            return None

    async def close(self) -> None:
        """Stop the checkpoint thread and close the connection, off the event loop."""
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

    # ------------------------------------------------------------------ running a statement

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
            delay = self.next_backoff(delay)

    def next_backoff(self, delay: float) -> float:
        """The sleep after ``delay`` while the database stays locked: doubling up to
        :attr:`MAX_BACKOFF` (another process's lock), :attr:`CKPT_BACKOFF` while this connection's
        own checkpoint holds it (it ends within milliseconds: the writer goes on right after)."""
        if self.ckpt_locking or self.ckpt_urgent:
            return self.CKPT_BACKOFF
        return min(delay * 2, self.MAX_BACKOFF)

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

    def _give_way(self) -> None:
        """Before a write: while a checkpoint that the disk's room needs is asked for or under way,
        the write waits (as for a lock: the async back-off), so the checkpoint gets the write lock
        at once. Else a loop that writes without a pause starves it (SQLite's busy handler sleeps
        between its tries), and the WAL fills the disk: a checkpoint then cannot run at all (it
        copies pages into the database first), so the WAL can never shrink again."""
        if self.ckpt_urgent and self.ckpt_thread is not None and self.ckpt_thread.is_alive():
            raise Busy(sqlite3.OperationalError("database is locked (a WAL checkpoint the disk's room needs)"))

    def _execute(self, conn: sqlite3.Connection, stmt: Stmt, params: Params) -> int:
        self._give_way()
        n = execute(conn, stmt, params).rowcount  # autocommit: its own transaction
        self._committed()
        return n

    @staticmethod
    def _fetchall(conn: sqlite3.Connection, stmt: Stmt, params: Params) -> list[Any]:
        return execute(conn, stmt, params).fetchall()

    def _together(self, conn: sqlite3.Connection, commits: Sequence[Commit]) -> list[bool]:
        """Each commit's guard, then its ops when the guard held; one transaction."""
        self._give_way()
        conn.execute("BEGIN IMMEDIATE")  # (as _writing does, inline: this is every commit's path)
        try:
            done = _merged(conn, commits) if len(commits) > 1 and _mergeable(commits) else None
            out, pages, text = done if done is not None else _each(conn, commits)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        self._committed(pages * self.frame + text)
        return out

    def _statements(self, conn: sqlite3.Connection, calls: Sequence[Call]) -> list[Any]:
        self._give_way()
        out = []
        with _writing(conn):
            for stmt, params, rows in calls:
                cur = execute(conn, stmt, params)
                out.append(cur.fetchall() if rows else cur.rowcount)
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
        # a file on read-only storage is read as it can be (immutable=1 for a WAL one): see .readonly
        ro = read_only_fallback(self.database, self.uri)
        try:
            conn = sqlite3.connect(ro or self.database, uri=self.uri or ro is not None, isolation_level=None,
                                   check_same_thread=False, timeout=0)
        except sqlite3.Error as e:
            raise wrap(e, self.where) from e
        try:
            if ro is not None:  # reads only: a write fails with the read-only error, in one line
                ensure_schema(SqliteDb(conn, self.where))
                self.conn, self.wal = conn, False
                return conn
            sqlite_pragmas(conn, self.synchronous, 0)  # never wait on the loop: _retry waits
            self.wal = conn.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal"
            if self.wal:
                # checkpoints (which fsync) run on a background thread, not in a commit
                conn.execute("PRAGMA wal_autocheckpoint = 0")
                conn.execute(f"PRAGMA journal_size_limit = {self.WAL_KEEP}")
                self.db_path = conn.execute("PRAGMA database_list").fetchone()[2] or ""
                self.frame = conn.execute("PRAGMA page_size").fetchone()[0] + 24
                self.wal_path = self.db_path + "-wal" if self.db_path else ""
            ensure_schema(SqliteDb(conn, self.where))
            self._probe_writable(conn)
        except BaseException:
            conn.close()
            raise
        self.conn = conn
        return conn

    @staticmethod
    def _probe_writable(conn: sqlite3.Connection) -> None:
        """Fail at open, not at the first write in the middle of a run, when the file is read-only."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            execute(conn, q.WRITE_PROBE, {"key": "write_probe", "value": ""})
        finally:
            conn.execute("ROLLBACK")

    # ------------------------------------------------------------------ WAL checkpoints off the loop

    def _committed(self, bound: Optional[int] = None) -> None:
        """After a commit that wrote at most ``bound`` bytes to the WAL (None: unknown): ask for a
        checkpoint once the WAL has outgrown its limit, or the room left on its disk. The WAL's size
        is looked at only once the commits since the last look may have added :attr:`WAL_STRIDE`
        bytes (or an eighth of the limit, or a sixteenth of the disk's room, when that is less)."""
        if not self.wal_path:
            return
        if bound is not None:
            self.unseen += bound
            if self.unseen < min(self.WAL_STRIDE, self.wal_limit // 8, self.room // 16):
                return
        self.unseen = 0
        try:
            wal = os.stat(self.wal_path).st_size
            disk = os.statvfs(self.wal_path)
            # a disk with less room left than ROOM_PER_WAL times the WAL: checkpoint now, while the
            # database can still grow by the WAL's new pages and the writes that go on meanwhile still
            # fit (a checkpoint copies the pages into the database before the WAL file is cut: once the
            # disk is full it fails, and the WAL cannot shrink again), and look again sooner
            self.room = disk.f_bavail * disk.f_frsize
            tight = self.ROOM_PER_WAL * wal > self.room
            if wal <= self.wal_limit and not tight:
                return
            # the limit follows the database (its size), up to WAL_CAP. (Twice its size made fewer
            # checkpoints, but the WAL file and the database then outgrew an 8 MiB disk that a
            # 60-item batch fits: tests/test_sqlite_wal.py's full-disk case failed 1 run in ~20.)
            size = os.stat(self.db_path).st_size
            self.wal_limit = min(max(self.WAL_LIMIT, size), max(self.WAL_CAP, self.WAL_LIMIT))
        except OSError:  # (the file is gone or unreadable: the next commit looks again)
            return
        if wal > self.wal_limit or tight:
            if tight:
                self.ckpt_urgent = True  # (the loop's writes give way to it: see _give_way)
            self._ask_checkpoint()

    def _ask_checkpoint(self) -> None:
        self.checkpoints += 1
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
                    # PASSIVE copies what it can while writers go on; TRUNCATE then takes the write lock
                    # (the loop backs off meanwhile) to copy the rest and empty the WAL — a passive one
                    # alone would leave it growing behind a busy writer
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                    self.ckpt_locking = True
                    try:
                        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
                    finally:
                        self.ckpt_locking = False
                except sqlite3.Error as e:  # busy, read-only or a full disk: the next commit asks again
                    log.debug("WAL checkpoint skipped: %s", e)
                finally:
                    self.ckpt_urgent = False
        finally:
            conn.close()


#: WAL pages a commit's guard may write (the lease's row: its table's page and a split's)
_GUARD_PAGES = 2
#: WAL pages one written row may touch besides its text: its table's leaf and each index's, and
#: a split of each (far more than a row of the engine's writes touches: they share pages)
_ROW_PAGES = 8


#: the statements a group of commits writes as one ``executemany`` each, in this order: what a
#: run's commit holds (:func:`~.store._write_ops`), the parts before the messages, as
#: PostgreSQL's group commit writes them
_MERGED: tuple[Stmt, ...] = (q.UPSERT_SESSION, q.UPSERT_PART, q.UPSERT_MESSAGE)


def _each(conn: sqlite3.Connection, commits: Sequence[Commit]) -> tuple[list[bool], int, int]:
    """Each commit's guard, then its ops when it held: ``(held per commit, WAL pages, text bytes)``."""
    out = []
    pages, text = 0, 0
    for ops, guard in commits:
        ok = guard is None or held(execute(conn, guard[0], guard[1]).rowcount)
        pages += _GUARD_PAGES
        if ok:
            for stmt, params in ops:
                p, t = _write_rows(conn, stmt, _as_rows(params))
                pages += p
                text += t
        out.append(ok)
    return out, pages, text


def _as_rows(params: Any) -> Sequence[Params]:
    """An op's rows: its list of rows, or its one row."""
    return params if isinstance(params, list) else (params,)


def _write_rows(conn: sqlite3.Connection, stmt: Stmt, rows: Sequence[Params]) -> tuple[int, int]:
    """``rows`` of ``stmt`` (one ``execute`` for one row); what they may add to the WAL (:func:`_bound`)."""
    if len(rows) == 1:
        execute(conn, stmt, rows[0])
    else:
        execute_many(conn, stmt, rows)
    return _bound(rows)


def _mergeable(commits: Sequence[Commit]) -> bool:
    """Whether a group's rows can be written statement by statement, every part before every
    message (:data:`_MERGED`): its ops are of those statements only, and no commit writes a part
    of a message it wrote before (that part drops the message's stored view, a trigger: written
    first, it would leave the view). Different runs write different sessions' rows."""
    for ops, _ in commits:
        messages: set[str] = set()  # the messages this commit has written so far
        for stmt, params in ops:
            rows = _as_rows(params)
            if stmt is q.UPSERT_MESSAGE:
                messages.update(r["id"] for r in rows)
            elif stmt is q.UPSERT_PART:
                if messages and any(r["message_id"] in messages for r in rows):
                    return False
            elif stmt is not q.UPSERT_SESSION:
                return False
    return True


def _merged(conn: sqlite3.Connection, commits: Sequence[Commit]) -> Optional[tuple[list[bool], int, int]]:
    """A group written as one ``executemany`` per statement — the leases' guards, then each of
    :data:`_MERGED` — instead of several per commit: ``(held per commit, WAL pages, text bytes)``.
    None when a lease's guard did not hold, before anything else ran: :func:`_each` then tells
    which (renewing a lease twice changes nothing). Other guards (a lease's insert, a batch
    item's end) run one by one, in order; they touch other tables than the rows merged."""
    renew = [guard[1] for _, guard in commits if guard is not None and guard[0] is q.LEASE_GUARD]
    if renew and execute_many(conn, q.LEASE_GUARD, renew).rowcount != len(renew):
        return None
    out = [guard is None or guard[0] is q.LEASE_GUARD or held(execute(conn, guard[0], guard[1]).rowcount)
           for _, guard in commits]
    rows: dict[Stmt, list[Params]] = {stmt: [] for stmt in _MERGED}
    for (ops, _), ok in zip(commits, out):
        if ok:
            for stmt, params in ops:
                rows[stmt].extend(_as_rows(params))
    pages, text = _GUARD_PAGES * len(commits), 0
    for stmt, params in rows.items():
        if params:
            p, t = _write_rows(conn, stmt, params)
            pages += p
            text += t
    return out, pages, text


def _bound(rows: Sequence[Params]) -> tuple[int, int]:
    """A bound of what writing ``rows`` adds to the WAL: ``(pages, bytes of text)``. A row's long
    text is its ``data`` (and a message's ``model_view``), counted at 4 bytes a character (UTF-8's
    most) — overflow pages hold it; a row without ``data`` counts its every string."""
    pages, text = 0, 0
    for r in rows:
        pages += _ROW_PAGES
        if not isinstance(r, dict):
            continue
        data = r.get("data")
        if isinstance(data, str):
            view = r.get("model_view")
            text += len(data) + (len(view) if isinstance(view, str) else 0)
        else:
            text += sum(len(v) for v in r.values() if isinstance(v, (str, bytes)))
    return pages, 4 * text


@contextlib.contextmanager
def _writing(conn: sqlite3.Connection) -> Iterator[None]:
    """A write transaction (``BEGIN IMMEDIATE``): committed at the end, rolled back on any error."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
