"""A TCP proxy in front of PostgreSQL that lets chosen statements commit and then drops their answer.

Used by ``test_pg_lost_answer.py`` (issue 32, item 1): the client's messages are read as the
wire protocol frames them (the startup message, then a type byte and a length); the ``nth``
query or parse message that holds ``marker`` (the text of one statement) dooms its connection:
the server's answer is read up to its ``ReadyForQuery`` — the statement has committed by then —
and both sockets are closed instead of passing it on. The client sees a connection lost after
its statement ran: the lost answer. Connect with ``sslmode=disable`` (the proxy reads plain text).
"""

from __future__ import annotations

import asyncio
import struct
from typing import Optional

__all__ = ["DropAnswer"]


class DropAnswer:
    """``await proxy.start()``; ``proxy.url``; ``proxy.dropped`` counts the answers dropped."""

    def __init__(self, marker: bytes, nth: int = 1, *, times: int = 1, host: str = "127.0.0.1", port: int = 5432,
                 database: str = "test", user: str = "postgres"):
        self.marker, self.nth, self.times = marker, nth, times
        self.target = (host, port)
        self.database, self.user = database, user
        self.seen = 0  # messages holding the marker so far
        self.dropped = 0
        self.server: Optional[asyncio.AbstractServer] = None
        self.port = 0
        self.tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return (f"postgresql://{self.user}@127.0.0.1:{self.port}/{self.database}"
                "?sslmode=disable&gssencmode=disable")

    async def start(self) -> "DropAnswer":
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for t in list(self.tasks):
            t.cancel()
        if self.tasks:
            await asyncio.wait(list(self.tasks))

    async def _serve(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        try:
            sreader, swriter = await asyncio.open_connection(*self.target)
        except OSError:
            cwriter.close()
            self.tasks.discard(task)
            return
        doomed = asyncio.Event()
        up = asyncio.ensure_future(self._up(creader, swriter, doomed))
        down = asyncio.ensure_future(self._down(sreader, cwriter, doomed))
        try:
            await asyncio.wait([up, down], return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            pass
        finally:
            for t in (up, down):
                t.cancel()
            for w in (cwriter, swriter):
                w.transport.abort()
            self.tasks.discard(task)

    async def _up(self, r: asyncio.StreamReader, w: asyncio.StreamWriter, doomed: asyncio.Event) -> None:
        """Client → server: the startup message, then typed messages; marks the doomed one."""
        head = await r.readexactly(4)
        (n,) = struct.unpack("!I", head)
        w.write(head + await r.readexactly(n - 4))
        while True:
            kind = await r.readexactly(1)
            head = await r.readexactly(4)
            (n,) = struct.unpack("!I", head)
            body = await r.readexactly(n - 4)
            if kind in (b"Q", b"P") and self.marker in body and not doomed.is_set():
                self.seen += 1
                if self.seen >= self.nth and self.dropped < self.times:
                    self.dropped += 1
                    doomed.set()
            w.write(kind + head + body)
            await w.drain()

    async def _down(self, r: asyncio.StreamReader, w: asyncio.StreamWriter, doomed: asyncio.Event) -> None:
        """Server → client: passed on until the doomed statement's answer, which ends the connection
        once its ReadyForQuery shows the statement done (committed)."""
        while True:
            kind = await r.readexactly(1)
            head = await r.readexactly(4)
            (n,) = struct.unpack("!I", head)
            body = await r.readexactly(n - 4)
            if doomed.is_set():
                if kind == b"Z":
                    return  # (the answer is dropped: both sockets are closed)
                continue
            w.write(kind + head + body)
            await w.drain()
