"""Sortable ids and wall-clock times.

Ids sort in creation order: ``<prefix>_<14 hex digits of microseconds><10 random hex>``, so
a persisted transcript is ordered by id alone, in any backend. Within a process the time
part strictly increases (thread-safe). Across processes and hosts the clocks need not
agree: a run seeds its :class:`IdSequence` with the session's highest stored id, so a
turn written from a machine whose clock is behind still sorts after the older turns.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Iterable, Optional

__all__ = ["now", "new_id", "IdSequence", "id_time"]

_lock = threading.Lock()
_last = 0


def now() -> float:
    """Wall-clock time as epoch seconds (float; JSON round-trips it exactly)."""
    return time.time()


def id_time(value: str) -> Optional[int]:
    """The time part (microseconds) of an id made here, or None for a foreign id."""
    _, sep, rest = value.rpartition("_")
    if not sep or len(rest) != 24:
        return None
    try:
        return int(rest[:14], 16)
    except ValueError:
        return None


def _next(floor: int) -> int:
    global _last
    t = time.time_ns() // 1000
    with _lock:
        if t <= _last:
            t = _last + 1
        if t <= floor:
            t = floor + 1
        _last = t
    return t


def new_id(prefix: str) -> str:
    """A new id such as ``msg_0615f3a2b4c5d6e7a1b2c3d4``: strictly increasing within a process."""
    return f"{prefix}_{_next(0):014x}{os.urandom(5).hex()}"


class IdSequence:
    """Ids for one run: after every id already stored in the session, whatever the clock says."""

    __slots__ = ("_floor",)

    def __init__(self, stored: Iterable[str] = ()) -> None:
        self._floor = 0
        self.seed(stored)

    def seed(self, stored: Iterable[str]) -> None:
        """Raise the floor to the newest of ``stored`` (ids of messages and parts)."""
        for value in stored:
            t = id_time(value)
            if t is not None and t > self._floor:
                self._floor = t

    def __call__(self, prefix: str) -> str:
        t = _next(self._floor)
        self._floor = t
        return f"{prefix}_{t:014x}{os.urandom(5).hex()}"
