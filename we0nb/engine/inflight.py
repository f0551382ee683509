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
_running: dict[_Key, threading.Event] = {}


def begin(session_id: str, part_id: str) -> threading.Event:
    """A sync execution of the call ``part_id`` starts; the event is set when its thread returns."""
    done = threading.Event()
    _running[(session_id, part_id)] = done
    return done


def end(session_id: str, part_id: str, done: threading.Event) -> None:
    """Its thread returned (called on that thread: a dict's item removal is atomic)."""
    key = (session_id, part_id)
    if _running.get(key) is done:
        _running.pop(key, None)
    done.set()


async def settled(session_id: str, part_id: str, timeout: float) -> bool:
    """Whether no execution of the call runs in this process any more (waiting up to ``timeout``)."""
    done = _running.get((session_id, part_id))
    if done is None or done.is_set():
        return True
    return await asyncio.to_thread(done.wait, timeout)
