"""SQLite's writer process: the writes of many runs at once, off the event loop's core.

Why: in a batch (W7 of ``shared/BENCH.md``) SQLite's own work — the B-tree, the WAL's
writes — is about a third of the event loop's CPU, and on the loop's thread it delays every
other run. A thread would not help: ``sqlite3`` gives the GIL back around each row and must
then win it back from the busy loop (up to the 5 ms switch interval each time). A process has
its own GIL: the loop pickles each transaction's rows (a few µs) and the writer
(:mod:`.sqlite_writer_process`) runs them on the machine's other core.

Opt-in (``SqlPersistence(writer_process=True)``): on 2 shared cores W7 measured no clear gain
— the loop's pickling and pipe reads cost about what SQLite's calls did, and the process
spends ~1.5–2 ms of CPU per item of its own.

How: while several runs of one event loop write to a SQLite *file* (a batch), the store starts
one :class:`SqliteWriter` for that loop, and every write of :class:`~.inline.InlineSqlite` —
commits, lease and batch statements — goes to it at once (no wait for a pass of the loop); the
commits that reach the process while it writes go together in its next transaction (the group
commit forms there). Reads stay on the loop's own connection (WAL: a reader never waits for the
writer, and sees every commit the writer has answered). The writer stops when the loop's last
lease is released, with the store, or when
``asyncio.run()`` ends its loop. A run alone never uses it: one commit inline (~20 µs) is less
than a hop to another process.

Guarantees kept from the inline path: a statement is never cut in half (a caller cancelled
while its statement is at the writer gets its outcome first, and the cancel at its next
await, as inline); an error comes back as the same :class:`~we0nb.PersistenceError`. A writer
that dies fails the statements it had (each may or may not have been written, as after a
crash) and the store writes inline again.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import sqlite3
import subprocess
import sys
from typing import Any, Optional, TypeVar

from ...errors import PersistenceError
from . import sqlite_frames
from .errors import wrap

__all__ = ["SqliteWriter", "outcome", "writer_possible"]

log = logging.getLogger("we0nb.persistence.sql")

_PROCESS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sqlite_writer_process.py")

T = TypeVar("T")


def writer_possible() -> bool:
    """A second core to run on, and asyncio subprocesses (POSIX)."""
    if os.name != "posix":
        return False
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return cores > 1


class SqliteWriter:
    """One writer process, for one event loop: :meth:`call` sends a request and returns its answer.

    Its pipes are non-blocking and read by the loop (``add_reader``) — and, to save a pass, by
    the caller itself: :meth:`call` sends, yields once, and by then the answer is usually in
    the pipe (the process writes a group in well under a pass of a busy loop).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, where: str, proc: "subprocess.Popen[bytes]"):
        self.loop, self.where, self.proc = loop, where, proc
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        self.wfd, self.rfd, self.efd = proc.stdin.fileno(), proc.stdout.fileno(), proc.stderr.fileno()
        for fd in (self.wfd, self.rfd, self.efd):
            os.set_blocking(fd, False)
        self.pending: collections.deque[asyncio.Future[Any]] = collections.deque()
        self.usable = False  # True from its first answer until stop() or its end
        self.gone = False
        self.ended: asyncio.Future[None] = loop.create_future()
        self._out = bytearray()  # frames the pipe did not take yet
        self._buf = bytearray()
        self._err = bytearray()  # the end of its standard error, for the message if it dies
        loop.add_reader(self.rfd, self.read)
        loop.add_reader(self.efd, self._read_err)

    @classmethod
    async def start(cls, config: dict[str, Any], where: str) -> "SqliteWriter":
        """A running writer on the running loop, its connection open (raises PersistenceError if not)."""
        loop = asyncio.get_running_loop()
        # on a thread: the fork waits for the exec (a few ms the loop need not spend)
        proc = await asyncio.to_thread(subprocess.Popen, [sys.executable, "-I", _PROCESS], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, close_fds=True)
        w = cls(loop, where, proc)
        try:
            await outcome(w._frame(config))
        except BaseException:
            await w.stop()
            raise
        w.usable = True
        return w

    async def call(self, request: Any) -> Any:
        """A request's answer (see :mod:`.sqlite_writer_process`), one pass after sending it if it is back."""
        fut = self._frame(request)
        try:
            await asyncio.sleep(0)  # one pass: the answer is usually back by then
        except asyncio.CancelledError:
            return await _after_cancel(fut)
        if not fut.done():
            self.read()
        return await outcome(fut)

    def _frame(self, obj: Any) -> "asyncio.Future[Any]":
        fut = self.loop.create_future()
        if self.gone or self.wfd < 0:
            fut.set_exception(self._gone_error())
            return fut
        frame = sqlite_frames.encode([obj])
        self.pending.append(fut)
        if self._out:
            self._out += frame
            return fut
        try:
            n = os.write(self.wfd, frame)
        except BlockingIOError:
            n = 0
        except OSError:  # its end of the pipe is closed: it died (read() tells the pending)
            n = len(frame)
        if n < len(frame):
            self._out += frame[n:]
            self.loop.add_writer(self.wfd, self._flush)
        return fut

    def _flush(self) -> None:
        try:
            n = os.write(self.wfd, self._out)
        except BlockingIOError:
            return
        except OSError:
            n = len(self._out)
        del self._out[:n]
        if not self._out:
            self.loop.remove_writer(self.wfd)
            if not self.usable:  # stop() waits for the last frames to go
                self._close_input()

    async def stop(self) -> None:
        """No new requests; the process answers what it has, sees the end of its input and exits."""
        self.usable = False
        if not self._out:
            self._close_input()
        if not self.gone:
            await asyncio.shield(self.ended)
        for _ in range(200):  # it exits right after its output closed: reap it without blocking
            if self.proc.poll() is not None:
                break
            await asyncio.sleep(0.005)
        else:
            self.proc.kill()
            await asyncio.sleep(0)
            self.proc.poll()
        for f in (self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()

    def _close_input(self) -> None:
        if self.wfd >= 0:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.wfd = -1

    # ------------------------------------------------------------------ from the pipes

    def read(self) -> None:
        """Take the answers that are in the pipe (never waits)."""
        if self.gone:
            return
        data = _read_now(self.rfd, 1 << 20)
        if data is None:
            return
        if not data:
            self._end()
            return
        self._buf += data
        answers, end = sqlite_frames.decode(self._buf)
        del self._buf[:end]
        for answer in answers:
            fut = self.pending.popleft()
            if fut.done():  # its caller left, and so did outcome(): nothing waits for it
                continue
            if answer[0] == "ok":
                fut.set_result(answer[1])
            else:
                fut.set_exception(self._error(answer[1], answer[2]))

    def _read_err(self) -> None:
        data = _read_now(self.efd, 1 << 16)
        if data is None:
            return
        if not data:
            self.loop.remove_reader(self.efd)
            return
        self._err += data
        del self._err[:-4096]

    def _error(self, text: str, name: Optional[str]) -> PersistenceError:
        e = sqlite3.OperationalError(text)
        e.sqlite_errorname = name  # type: ignore[attr-defined]  # what wrap() reads, as from sqlite3
        err = wrap(e, self.where)
        err.__cause__ = e
        return err

    def _end(self) -> None:
        """Its standard output closed: no answer can come any more."""
        self.usable = False
        self.gone = True
        self.loop.remove_reader(self.rfd)
        if self._out:
            self.loop.remove_writer(self.wfd)
            self._out.clear()
        self._read_err()
        while self.pending:
            fut = self.pending.popleft()
            if not fut.done():
                fut.set_exception(self._gone_error())
        if not self.ended.done():
            self.ended.set_result(None)

    def _gone_error(self) -> PersistenceError:
        code = self.proc.poll()
        tail = bytes(self._err[-300:]).decode(errors="replace").strip().splitlines()
        why = f": {tail[-1]}" if tail else ""
        return PersistenceError(
            f"The SQLite writer process of {self.where} ended (exit code {code}{why}) with statements "
            "unanswered: each may or may not have been written, as after a crash. Resume the runs "
            "(mode='resume'); further writes run on the event loop's own connection.")


def _read_now(fd: int, size: int) -> Optional[bytes]:
    """What a non-blocking pipe holds: None when nothing is there yet, ``b""`` once it is closed."""
    try:
        return os.read(fd, size)
    except BlockingIOError:
        return None
    except OSError:
        return b""


async def outcome(fut: "asyncio.Future[T]") -> T:
    """``fut``'s result once the writer has answered. A cancel that lands meanwhile is held back
    until then — the statement is at the writer and will be written or fail whatever happens,
    and the caller must know which — and then passed on, at the caller's next await (as after a
    statement run inline, which a cancel never cuts in half)."""
    if fut.done():
        return fut.result()
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        if fut.cancelled():
            raise
    return await _after_cancel(fut)


async def _after_cancel(fut: "asyncio.Future[T]") -> T:
    while not fut.done():
        try:
            await asyncio.shield(fut)
        except asyncio.CancelledError:
            if fut.cancelled():
                raise
    task = asyncio.current_task()
    if task is not None:
        uncancel = getattr(task, "uncancel", None)  # Python 3.11+: the count asyncio.timeout() reads
        if uncancel is not None:
            uncancel()
        task.cancel()
    return fut.result()
