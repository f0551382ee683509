"""The objects alive when a batch starts are left out of the collections it causes.

A batch allocates steadily for seconds or hours, and each full pass of Python's cyclic
garbage collector walks every tracked object of the process — the imports, the pydantic
schemas, the notebook's own data — while every item of the batch waits: in memory, W7's
2,000 items cause four such passes and ~580 younger ones, and the batch ran 0.14 s of its
4.3 s longer than with the collector off (``bench/``, ``docs/performance.md``).
:func:`frozen_heap` moves what exists when the first batch of the process starts into the
collector's permanent generation (:func:`gc.freeze`) and back when the last one ends
(:func:`gc.unfreeze`): what the batch creates is collected as usual, and garbage that the
older objects become meanwhile is collected after it. A process that froze objects itself,
or turned the collector off, is left as it is; a child forked meanwhile gets its objects back.
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
from typing import Iterator

__all__ = ["frozen_heap"]

_lock = threading.Lock()
_depth = 0  # batches running now, in every thread
_ours = False  # whether the objects frozen now were frozen here


def _forked() -> None:
    """In a child forked while a batch ran (by a tool, say): that batch is not running here."""
    global _depth, _ours, _lock
    _lock = threading.Lock()
    _depth = 0
    if _ours:
        _ours = False
        gc.unfreeze()


if hasattr(os, "register_at_fork"):  # (POSIX)
    os.register_at_fork(after_in_child=_forked)


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Around a batch (or a scoring): the objects of before are not traversed by its collections."""
    global _depth, _ours
    with _lock:
        if _depth == 0:
            _ours = gc.isenabled() and gc.get_freeze_count() == 0
            if _ours:
                gc.freeze()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _ours:
                _ours = False
                gc.unfreeze()
