"""One ``tools/call`` on a live connection: the idempotency key in ``_meta``, a progress token
whose notifications reach the user's ``on_progress`` (and the call's metadata), and the
timeout — the SDK's, or ours when it restarts at each progress notification."""

from __future__ import annotations

import logging
from typing import Any, Optional

from ..tools import ToolContext, ToolError, ToolReturn
from .adapter import IDEMPOTENCY_META_KEY, to_return
from .client import InFlight, Progress, maybe_await
from .rounds import call_tool

__all__ = ["call_once"]

log = logging.getLogger("we0nb.mcp")


async def call_once(server: Any, session: Any, name: str, arguments: dict[str, Any],
                    context: Optional[ToolContext]) -> Any:
    """The tool's result as a tool return value (``metadata["progress"]`` the last progress);
    the SDK's exceptions pass through, except our own timeout, a :class:`ToolError`."""
    import anyio

    meta = {IDEMPOTENCY_META_KEY: context.idempotency_key} if context is not None else None
    updates = getattr(context, "updates", None)  # the run watching this call (progress, questions)
    last: list[Progress] = []
    timeout: Optional[float] = server.timeout
    # our own timeout scope when it must move: at each progress (if asked), or while a person answers
    asks = server.features.elicitation is not None and updates is not None
    own_timeout: Optional[float] = timeout if server.reset_timeout_on_progress or asks else None
    call = InFlight(name, updates, None, own_timeout) if updates is not None else None

    async def on_progress(progress: float, total: Optional[float], message: Optional[str]) -> None:
        event = Progress(server.name, name, context.call_id if context else None, progress, total, message)
        last[:] = [event]
        if updates is not None:
            updates.progress(event.as_metadata())
        if call is not None and call.scope is not None and call.timeout is not None \
                and server.reset_timeout_on_progress and call.scope.deadline != float("inf"):
            call.scope.deadline = anyio.current_time() + call.timeout
        if server.on_progress is not None:
            try:
                await maybe_await(server.on_progress(event))
            except Exception as e:
                log.warning("%s: on_progress raised %s: %s", server.label, type(e).__name__, e)

    if call is not None:
        server.features.calls.append(call)
    try:
        if own_timeout is not None:
            with anyio.CancelScope(deadline=anyio.current_time() + own_timeout) as scope:
                if call is not None:
                    call.scope = scope
                result = await call_tool(session, name, arguments, progress_callback=on_progress, meta=meta)
            if scope.cancelled_caught:
                since = "its last progress (reset_timeout_on_progress=True)" if server.reset_timeout_on_progress \
                    else "its start (time a person took to answer not counted)"
                raise ToolError(f"{server.label} did not answer the call to {name!r} within {own_timeout:g} s of "
                                f"{since}, so it was cancelled (notifications/cancelled sent); its outcome is "
                                "unknown.", {"mcp_error": "timeout", **_progress(last)})
        else:
            result = await call_tool(session, name, arguments, read_timeout_seconds=timeout,
                                     progress_callback=on_progress, meta=meta)
    finally:
        if call is not None:
            server.features.calls.remove(call)
    try:
        value = to_return(result, server.label, name)
    except ToolError as e:
        e.metadata.update(_progress(last))
        raise
    if not last:
        return value
    if isinstance(value, ToolReturn):
        return ToolReturn(value.output, value.attachments, {**value.metadata, **_progress(last)})
    return ToolReturn(value, (), _progress(last))


def _progress(last: list[Progress]) -> dict[str, Any]:
    return {"progress": last[-1].as_metadata()} if last else {}
