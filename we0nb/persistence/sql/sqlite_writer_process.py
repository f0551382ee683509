"""The SQLite writer process: the write transactions of one event loop, in order, on another core.

Started by :mod:`.sqlite_writer` as ``python -I <this file>``; standard library only (it loads
:mod:`.sqlite_tx` and :mod:`.sqlite_frames` by path, not the we0nb package, so it starts in a
few milliseconds). On standard input, frames (:mod:`.sqlite_frames`): first the configuration
(database, uri, synchronous, busy timeout, the statements' texts), then requests: a
list of commits (:func:`.sqlite_tx.together`), ``("statements", queries)`` or
``("execute", (key, params))``. Each gets one answer on standard output, in
order: ``("ok", [written, ...])`` or ``("error", text, sqlite_errorname)``. The commit requests
that arrive while one is written go together in the next transaction (a group commit: each run
sends its commit at once, and the group forms here). A locked database is waited for here
(``busy_timeout``): this process has no event loop to keep free.

It ends at the end of its input — its parent closed the pipe, or died — after answering
every request before it: what it was sent is written or answered with an error, never dropped
half-way (a transaction is all or nothing).
"""

from __future__ import annotations

import collections
import os
import signal
import sqlite3
import sys
from typing import Any, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sqlite_frames  # noqa: E402  (by path: see the docstring)
import sqlite_tx  # noqa: E402


class _Frames:
    """Frames from a file descriptor: :meth:`next` waits for one; :meth:`ready` takes those already here."""

    def __init__(self, fd: int):
        self.fd, self.buf = fd, bytearray()
        self.have: collections.deque[Any] = collections.deque()  # decoded, not taken yet
        self.eof = False

    def _fill(self) -> None:
        data = os.read(self.fd, 1 << 20)
        if not data:
            self.eof = True
        self.buf += data
        frames, end = sqlite_frames.decode(self.buf)
        del self.buf[:end]
        self.have.extend(frames)

    def next(self) -> Optional[Any]:
        """The next frame, waiting for it; None at the end of the input."""
        while not self.have:
            if self.eof:
                return None
            self._fill()
        return self.have.popleft()

    def ready(self) -> list[Any]:
        """The frames already read in full (no wait)."""
        out = list(self.have)
        self.have.clear()
        return out


def _write(out: int, replies: list[Any]) -> None:
    view = memoryview(sqlite_frames.encode(replies))
    while view:
        view = view[os.write(out, view):]


def _connect(config: dict[str, Any]) -> sqlite3.Connection:
    conn = sqlite3.connect(config["database"], uri=config["uri"], isolation_level=None,
                           timeout=config["busy_timeout"])
    conn.execute(f"PRAGMA busy_timeout = {int(config['busy_timeout'] * 1000)}")
    conn.execute(f"PRAGMA synchronous = {config['synchronous']}")
    conn.execute("PRAGMA wal_autocheckpoint = 0")  # the parent's checkpoint thread does them
    return conn


def _error(e: BaseException) -> tuple[str, str, Optional[str]]:
    if isinstance(e, sqlite3.Error):
        return ("error", str(e), getattr(e, "sqlite_errorname", None))
    return ("error", f"{type(e).__name__}: {e}", None)


def _one(conn: sqlite3.Connection, sql: dict[str, str], request: Any) -> Any:
    try:
        if isinstance(request, list):
            return ("ok", sqlite_tx.together(conn, sql, request))
        op, args = request
        if op == "statements":
            return ("ok", sqlite_tx.statements(conn, sql, args))
        if op == "execute":
            return ("ok", sqlite_tx.execute(conn, sql, *args))
        return ("error", f"unknown request {op!r}", None)
    except Exception as e:  # on purpose: a bad parameter must answer its request, not end the process
        return _error(e)


def _group(conn: sqlite3.Connection, sql: dict[str, str], requests: list[list]) -> list[Any]:
    """Requests of commits in one transaction while none fails: those that reached this process
    together share its WAL pages and its COMMIT."""
    if len(requests) == 1:
        return [_one(conn, sql, requests[0])]
    try:
        written = sqlite_tx.together(conn, sql, [c for commits in requests for c in commits])
    except Exception:  # on purpose: nothing was written; each request alone gets its own outcome
        return [_one(conn, sql, commits) for commits in requests]
    out, i = [], 0
    for commits in requests:
        out.append(("ok", written[i:i + len(commits)]))
        i += len(commits)
    return out


def _answer(conn: sqlite3.Connection, sql: dict[str, str], requests: list[Any]) -> list[Any]:
    """Each request answered, in order: a run of commit requests as one group, any other alone."""
    out: list[Any] = []
    commits: list[list] = []
    for request in requests:
        if isinstance(request, list):
            commits.append(request)
            continue
        if commits:
            out += _group(conn, sql, commits)
            commits = []
        out.append(_one(conn, sql, request))
    if commits:
        out += _group(conn, sql, commits)
    return out


def main() -> int:
    # Ctrl-C (a terminal's, or a kernel's interrupt sent to its process group) is for the parent,
    # whose run then records its abort through this process: it ends at the end of its input
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    frames, out = _Frames(sys.stdin.fileno()), sys.stdout.fileno()
    config = frames.next()
    if config is None:
        return 0
    try:
        conn = _connect(config)
    except sqlite3.Error as e:
        _write(out, [_error(e)])
        return 1
    _write(out, [("ok", None)])
    sql = config["sql"]
    try:
        while True:
            first = frames.next()
            if first is None:
                return 0
            requests = [first] + frames.ready()
            _write(out, _answer(conn, sql, requests))
    except BrokenPipeError:  # the parent is gone: nothing is left to answer
        return 0
    finally:
        conn.close()


if __name__ == "__main__":
    sys.exit(main())
