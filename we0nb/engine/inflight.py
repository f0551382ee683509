"""Sync tool executions an abort let go of, until their worker thread returns.

An abort cancels the run's wait for a sync tool at once, but not the thread running it: the
tool goes on in the background and its effect may land after the run has ended. A resume
started in the same process meanwhile (what the Resume button does) must not take that call
for one that stopped: a reconcile asked then would find no effect yet and answer ``not_done``,
and the call would run twice. So each sync execution is registered here while its thread
runs; recovery waits for a ``running`` call's thread (up to the tool's ``reconcile_timeout``)
before it asks, and one still running is an ``unknown`` answer (see the recovery table).
"""

from __future__ import annotations

import asyncio
import threading

__all__ = ["begin", "end", "settled"]

_Key = tuple[str, str]
#: a lock per call whose thread runs, held until it returns (a lock, not an Event: a tenth of its cost)
_running: dict[_Key, "threading.Lock"] = {}


def begin(session_id: str, part_id: str) -> "threading.Lock":
    """A sync execution of the call ``part_id`` starts; the lock is released when its thread returns."""
    running = threading.Lock()
    running.acquire()
    _running[(session_id, part_id)] = running
    return running


def end(session_id: str, part_id: str, running: "threading.Lock") -> None:
    """Its thread returned (called on that thread: a dict's item removal is atomic)."""
    key = (session_id, part_id)
    if _running.get(key) is running:
        _running.pop(key, None)
    running.release()


async def settled(session_id: str, part_id: str, timeout: float) -> bool:
    """Whether no execution of the call runs in this process any more (waiting up to ``timeout``)."""
    running = _running.get((session_id, part_id))
    if running is None or not running.locked():
        return True
    return await asyncio.to_thread(_released, running, timeout)


def _released(running: "threading.Lock", timeout: float) -> bool:
    if not running.acquire(timeout=timeout):
        return False
    running.release()
    return True
