"""Sortable ids and wall-clock times.

Ids sort in creation order (hex microseconds + a per-process counter + random tail), so
a persisted transcript can be ordered by id alone, in any backend, across processes.
"""

from __future__ import annotations

import os
import time

_last = 0


def now() -> float:
    """Wall-clock time as epoch seconds (float; JSON round-trips it exactly)."""
    return time.time()


def new_id(prefix: str) -> str:
    """A new id such as ``msg_0615f3a2b4c5d6e7a1b2c3d4``: strictly increasing within a process."""
    global _last
    t = time.time_ns() // 1000
    if t <= _last:
        t = _last + 1
    _last = t
    return f"{prefix}_{t:014x}{os.urandom(5).hex()}"
