"""Sortable ids and wall-clock times.

Ids sort in creation order: ``<prefix>_<14 hex digits of microseconds><10 random hex>``, so
a persisted transcript is ordered by id alone, in any backend. Within a process the time
part strictly increases (thread-safe). Across processes and hosts the clocks need not
agree: a run seeds its :class:`IdSequence` with the session's highest stored id, so a
turn written from a machine whose clock is behind still sorts after the older turns.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from typing import Iterable, Optional

__all__ = ["now", "new_id", "new_ids", "IdSequence", "id_time", "call_key"]

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


#: random bytes drawn from ``os.urandom`` a few kilobytes at a time (one system call per
#: 800 ids instead of one per id); each id takes the next 5 bytes, never reused (a forked
#: child drops the parent's)
_RANDOM_CHUNK = 4000
_random = b""
_random_at = 0


def _next(floor: int) -> tuple[int, str]:
    """The next time part (strictly increasing, above ``floor``) and 10 hex digits of
    ``os.urandom`` output, under one lock (thread-safe)."""
    global _last, _random, _random_at
    t = time.time_ns() // 1000
    with _lock:
        if t <= _last:
            t = _last + 1
        if t <= floor:
            t = floor + 1
        _last = t
        at = _random_at
        if at + 5 > len(_random):
            _random, at = os.urandom(_RANDOM_CHUNK), 0
        _random_at = at + 5
        rand = _random[at:at + 5]
    return t, rand.hex()


def _forget_random() -> None:
    """In a forked child: never reuse the parent's bytes (both would make the same ids)."""
    global _random, _random_at
    _random, _random_at = b"", 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_random)


def new_ids(prefixes: "list[str]") -> list[str]:
    """New ids, one per prefix, in increasing order (as many :func:`new_id` calls in a row, under
    one lock: a fork names thousands of copied rows at once)."""
    global _last, _random, _random_at
    n = len(prefixes)
    if not n:
        return []
    t = time.time_ns() // 1000
    with _lock:
        if t <= _last:
            t = _last + 1
        _last = t + n - 1
        rand = os.urandom(5 * n)
    hexed = rand.hex()
    return [f"{p}_{t + i:014x}{hexed[10 * i:10 * i + 10]}" for i, p in enumerate(prefixes)]


def new_id(prefix: str) -> str:
    """A new id such as ``msg_0615f3a2b4c5d6e7a1b2c3d4``: strictly increasing within a process."""
    t, rand = _next(0)
    return f"{prefix}_{t:014x}{rand}"


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
        t, rand = _next(self._floor)
        self._floor = t
        return f"{prefix}_{t:014x}{rand}"


def call_key(session_id: str, part_id: str) -> str:
    """A tool call's idempotency key: ``we0nb-`` and 40 hex digits of SHA-256 over its session and
    part ids — the same for every execution of the call, on any host, and different for any two
    calls (a part id is unique in its session, a session id in its store; a fork's calls are
    parts of another session). Printable ASCII, 46 characters. Written with the call's first
    state and kept in every later one; derived again only for a call stored before keys existed."""
    digest = hashlib.sha256(f"{session_id}\x00{part_id}".encode("utf-8", "surrogatepass")).hexdigest()
    return f"we0nb-{digest[:40]}"
