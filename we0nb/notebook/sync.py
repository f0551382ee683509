"""Synchronous calls that work inside a running kernel without breaking "Run All".

A notebook cell already runs inside the kernel's event loop, so ``asyncio.run()`` there
raises "cannot be called from a running event loop", and patching the loop with the
original ``nest_asyncio`` 1.6 makes ipykernel ≥ 7.1 drop the queued cells of "Run All".
:func:`run_sync` instead runs the coroutine with ``asyncio.run`` on a worker thread (its
own loop) and waits for it; outside a running loop it is plain ``asyncio.run``.

The kernel is blocked while it waits: Abort buttons cannot work during a sync call —
use top-level ``await`` or :class:`~we0nb.notebook.RunPanel` for that. Do not pass
objects bound to the kernel's loop (an ``asyncio.Event`` that was already awaited
there) into the worker's coroutine.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import threading
from typing import Any, Awaitable, Callable, Optional, TypeVar, Union

__all__ = ["run_sync", "invoke_sync"]

T = TypeVar("T")


def run_sync(aw: Union[Awaitable[T], Callable[[], Awaitable[T]]], *, timeout: Optional[float] = None) -> T:
    """Run a coroutine (or a zero-argument coroutine function) to completion, synchronously.

    Works in a script and inside a running event loop (a notebook cell): there it runs on
    a worker thread with its own loop; prints and display updates still land in the
    calling cell (the caller's context variables are carried over).
    """
    if not (inspect.isawaitable(aw) or callable(aw)):
        raise TypeError(f"run_sync() expects a coroutine or a coroutine function, got {type(aw).__name__}.")

    async def main() -> T:
        target = aw() if callable(aw) and not inspect.isawaitable(aw) else aw
        return await target  # type: ignore[misc]

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main())

    ctx = contextvars.copy_context()
    box: dict[str, Any] = {}

    def worker() -> None:
        try:
            box["value"] = ctx.run(asyncio.run, main())
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc

    t = threading.Thread(target=worker, name="we0nb-run-sync", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise TimeoutError(f"run_sync(): the call did not finish within {timeout} s (it goes on in the background).")
    if "error" in box:
        raise box["error"]
    return box["value"]


def invoke_sync(agent: Any, *, timeout: Optional[float] = None, **kwargs: Any) -> Any:
    """``agent.invoke(**kwargs)`` synchronously (see :func:`run_sync`); returns the RunResult.

    ``kwargs`` are those of ``invoke`` (``mode=``, ``session_id=``, ``messages=``,
    ``abort=``); ``prompt="..."`` is a shortcut for ``messages=[user_message(prompt)]``.
    """
    prompt = kwargs.pop("prompt", None)
    if prompt is not None:
        if "messages" in kwargs:
            raise TypeError("invoke_sync(): pass either prompt= or messages=, not both.")
        from ..engine.request import user_message

        kwargs["messages"] = [user_message(prompt)]
    return run_sync(lambda: agent.invoke(**kwargs), timeout=timeout)
