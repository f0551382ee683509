"""A batch's garbage collections: the objects of before left out, the young ones walked less often.

A batch allocates steadily for seconds or hours, and each full pass of Python's cyclic
garbage collector walks every tracked object of the process — the imports, the pydantic
schemas, the notebook's own data — while every item of the batch waits: in memory, W7's
2,000 items cause four such passes and ~580 younger ones, and the batch ran 0.14 s of its
4.3 s longer than with the collector off (``bench/``, ``docs/performance.md``).
:func:`frozen_heap` moves what exists when the first batch of the process starts into the
collector's permanent generation (:func:`gc.freeze`) and back when the last one ends
(:func:`gc.unfreeze`): what the batch creates is collected as usual, and garbage that the
older objects become meanwhile is collected after it.

The young generation's threshold is raised to :data:`YOUNG_THRESHOLD` meanwhile (CPython's: 700
more objects alive than at the last collection). A batch's items are in flight together: ~100
runs' objects, allocated since the last collection and alive until their step ends, are all
young, so each young collection walks them all (tens of thousands of objects) — and the count
that triggers one reaches 700 many times a second. Measured with callgrind (W12, 3.11): the
collector took 148k instructions per judge verdict at 700, 103k at 2,000, 44k at 7,000, 9k at
20,000 (of ~2.8M). Garbage in reference cycles waits longer to be collected: at most that many
more objects. A process that froze objects itself, turned the collector off, or set a higher
threshold is left as it is; a child forked meanwhile gets its objects and threshold back.
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
from typing import Iterator, Optional

__all__ = ["frozen_heap", "YOUNG_THRESHOLD"]

#: the young generation's threshold while a batch runs (see above)
YOUNG_THRESHOLD = 20_000

_lock = threading.Lock()
_depth = 0  # batches running now, in every thread
_ours = False  # whether the objects frozen now were frozen here
_threshold: Optional[tuple[int, ...]] = None  # the thresholds before ours, while ours is set


def _forked() -> None:
    """In a child forked while a batch ran (by a tool, say): that batch is not running here."""
    global _depth, _ours, _lock
    _lock = threading.Lock()
    _depth = 0
    if _ours:
        _ours = False
        gc.unfreeze()
    _give_back_threshold()


if hasattr(os, "register_at_fork"):  # (POSIX)
    os.register_at_fork(after_in_child=_forked)


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Around a batch (or a scoring): the objects of before are not traversed by its collections,
    and the young ones are collected every :data:`YOUNG_THRESHOLD` objects, not every 700."""
    global _depth, _ours
    with _lock:
        if _depth == 0:
            _ours = gc.isenabled() and gc.get_freeze_count() == 0
            if _ours:
                gc.freeze()
            _raise_threshold()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                if _ours:
                    _ours = False
                    gc.unfreeze()
                _give_back_threshold()


def _raise_threshold() -> None:
    global _threshold
    before = gc.get_threshold()
    if gc.isenabled() and 0 < before[0] < YOUNG_THRESHOLD:
        _threshold = before
        gc.set_threshold(YOUNG_THRESHOLD, *before[1:])


def _give_back_threshold() -> None:
    """The thresholds of before, unless the process set others meanwhile (then they are its own)."""
    global _threshold
    before, _threshold = _threshold, None
    if before is not None and gc.get_threshold()[0] == YOUNG_THRESHOLD:
        gc.set_threshold(*before)
