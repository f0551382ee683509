"""Sync tools on worker threads, with the loop's wake-up as the worker's last work.

Why not ``asyncio.to_thread``: it goes through the loop's default ``ThreadPoolExecutor``,
whose worker, once the function has returned, settles a ``concurrent.futures.Future``, runs
its callbacks (one of them wakes the loop) and its own bookkeeping: Python that wants the GIL
back just as the woken loop runs the step's end. A SQLite store's calls release the GIL, so
the two threads then hand it back and forth, each handover a wake-up of a sleeping thread.
Here a worker marks itself idle, wakes the loop and waits for its next call (``shared/BENCH.md``'s
W2 with a sync tool: 0.298 → 0.270 ms a step; W3 on SQLite 0.59–0.66 → 0.55–0.60: the docs'
performance page).

As the default executor does: at most ``min(32, cpus + 4)`` threads, started as calls need
them; each call runs in a copy of its caller's context (a tracing span, a contextvar); at
interpreter exit the calls under way finish before it ends. A child made by ``fork`` starts
with no workers (the parent's threads do not exist there).
"""

from __future__ import annotations

import asyncio
import atexit
import contextvars
import os
import queue
import threading
from typing import Any, Callable, Optional, TypeVar

__all__ = ["run_in_thread"]

T = TypeVar("T")

#: the most worker threads, as ``concurrent.futures.ThreadPoolExecutor``'s default
MAX_THREADS = min(32, (os.cpu_count() or 1) + 4)


def _settle(fut: "asyncio.Future[Any]", ok: bool, value: Any) -> None:
    if not fut.done():  # (an awaiting task cancelled meanwhile: an abort; nobody wants the answer)
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)


class _Workers:
    """The worker threads of this process and the queue of their calls."""

    def __init__(self, max_threads: int):
        self.max = max_threads
        self.calls: "queue.SimpleQueue[Optional[tuple]]" = queue.SimpleQueue()
        self.idle = threading.Semaphore(0)  # a worker waiting for a call (counted as in the executor)
        self.threads: list[threading.Thread] = []
        self.lock = threading.Lock()
        self.closed = False

    def submit(self, call: tuple) -> None:
        with self.lock:
            if self.closed:
                raise RuntimeError("cannot run a sync tool on a worker thread: the interpreter is shutting down")
            self.calls.put(call)
            if not self.idle.acquire(blocking=False) and len(self.threads) < self.max:
                t = threading.Thread(target=self._work, name=f"we0nb-tool-{len(self.threads)}", daemon=True)
                t.start()
                self.threads.append(t)

    def _work(self) -> None:
        get, idle = self.calls.get, self.idle
        while True:
            call = get()
            if call is None:  # shut down: pass it on to the next worker
                self.calls.put(None)
                return
            loop, fut, ctx, fn, args, kwargs = call
            del call
            try:
                value, ok = ctx.run(fn, *args, **kwargs), True
            except BaseException as e:  # on purpose: the awaiting task gets whatever the tool raised
                value, ok = e, False
            idle.release()  # (before the wake-up: after it, this thread wants the GIL the loop holds)
            try:
                loop.call_soon_threadsafe(_settle, fut, ok, value)
            except RuntimeError:  # its loop has closed: nobody waits for this answer
                pass
            del loop, fut, ctx, fn, args, kwargs, value

    def shutdown(self) -> None:
        """Let the calls under way finish, then stop every worker (at interpreter exit)."""
        with self.lock:
            self.closed = True
            threads = list(self.threads)
        self.calls.put(None)
        for t in threads:
            t.join()


_workers: Optional[_Workers] = None
_made = threading.Lock()


def _pool() -> _Workers:
    global _workers
    w = _workers
    if w is None:
        with _made:
            if _workers is None:
                _workers = _Workers(MAX_THREADS)
                atexit.register(_workers.shutdown)
            w = _workers
    return w


def _forget_after_fork() -> None:
    global _workers, _made
    _workers, _made = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


async def run_in_thread(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` on a worker thread, in a copy of the caller's context; its result."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[T] = loop.create_future()
    _pool().submit((loop, fut, contextvars.copy_context(), fn, args, kwargs))
    return await fut
