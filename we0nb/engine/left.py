"""Runs their consumer left (a ``break`` out of ``stream()``), until they let go of their session.

Python closes an abandoned async generator later: asyncio's finalizer hook schedules its
``aclose()`` for the loop's next turns, and until that has run the run still holds its
session's lease. So a run started at once on the same session (``break``, then
``invoke(mode="resume")``) would be refused as busy by a store that answers without waiting
(``MemoryPersistence``). A run being closed registers here; a new run that finds its session
busy lets the loop turn, waits for such a run of the same loop, store and session to let go,
and asks once more. A session held by anything else is as busy as before.
"""

from __future__ import annotations

import asyncio

__all__ = ["closing", "closed", "wait_for_left_run"]

#: loop turns a scheduled close needs to start (the finalizer's ``call_soon``, then the task's first step)
_TURNS = 3
#: the longest wait for a closing run to write its last state and release its lease (seconds)
_WAIT = 10.0

_Key = tuple[int, int, str]
_closing: dict[_Key, "asyncio.Future[None]"] = {}


def _key(store: object, session_id: str) -> _Key:
    return id(asyncio.get_running_loop()), id(store), session_id


def closing(store: object, session_id: str) -> "asyncio.Future[None]":
    """A run of ``session_id`` on ``store`` is being closed by its consumer: done once it let go."""
    fut = asyncio.get_running_loop().create_future()
    _closing[_key(store, session_id)] = fut
    return fut


def closed(store: object, session_id: str, fut: "asyncio.Future[None]") -> None:
    """The run behind ``fut`` released its lease (or failed to: the lease then expires by itself)."""
    key = _key(store, session_id)
    if _closing.get(key) is fut:
        del _closing[key]
    if not fut.done():
        fut.set_result(None)


async def wait_for_left_run(store: object, session_id: str) -> bool:
    """After a busy answer: whether a run its consumer left held the session and has let go now."""
    for _ in range(_TURNS):
        await asyncio.sleep(0)
    fut = _closing.get(_key(store, session_id))
    if fut is None:
        return False
    try:
        await asyncio.wait_for(asyncio.shield(fut), _WAIT)
    except asyncio.TimeoutError:
        return False
    return True
