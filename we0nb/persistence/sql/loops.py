"""What the async database paths share about event loops: a connection belongs to the loop
that opened it, and must be closed on that loop, while it still runs.

Used by :mod:`.engine` (SQLAlchemy's asyncio engines) and :mod:`.pg` (psycopg's own pools).
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any, Awaitable, Callable, Optional

__all__ = ["running_loop", "at_shutdown"]


def running_loop() -> Optional[asyncio.AbstractEventLoop]:
    """The running event loop, or None outside one."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


async def at_shutdown(loop: asyncio.AbstractEventLoop, guards: "weakref.WeakKeyDictionary[Any, Any]",
                      cleanup: Callable[[], Awaitable[None]]) -> None:
    """Run ``cleanup()`` on ``loop`` when ``asyncio.run()`` shuts it down.

    ``asyncio.run()`` finalizes live async generators (``loop.shutdown_asyncgens()``) before
    it closes the loop: a suspended generator's ``finally`` is that moment. ``guards`` keeps
    the generator alive (the loop holds only a weak reference to it), keyed by its loop.
    """
    async def guard() -> Any:
        try:
            yield
        finally:
            guards.pop(loop, None)
            try:
                await cleanup()
            except Exception:  # on purpose: the loop is shutting down; nothing is left to tell
                pass

    agen: Any = guard()  # (an async generator: ``async def`` with ``yield``)
    await agen.__anext__()
    guards[loop] = agen
