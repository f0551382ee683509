"""Driving notebook widgets from a test without a kernel: wait for a condition, click as a kernel would."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Callable


async def until(pred: Callable[[], Any], timeout: float = 20) -> None:
    """Wait (on the loop) until ``pred()`` is true; fail after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, "timed out waiting"
        await asyncio.sleep(0.01)


def click_from_thread(button: Any) -> None:
    """Click ``button`` from another thread, as a kernel's control thread (a subshell) delivers it."""
    t = threading.Thread(target=button.click, name="subshell-fake")
    t.start()
    t.join()
