"""What a child forked from the test process says: for tests of what a fork resets."""

from __future__ import annotations

import os
import warnings
from typing import Callable


def in_forked_child(say: Callable[[], str]) -> str:
    """``say()`` run in a child forked from here, its answer read back. ``say`` must take no lock
    another thread may hold (Python 3.12+ warns of forking a threaded process: silenced here)."""
    r, w = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: answer, and leave without running the parent's cleanup
        try:
            os.write(w, say().encode())
        finally:
            os._exit(0)
    os.close(w)
    try:
        return os.read(r, 4096).decode()
    finally:
        os.close(r)
        os.waitpid(pid, 0)
