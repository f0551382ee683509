"""``tools/call`` across MCP 2026-07-28's multi-round-trip requests (SEP-2322).

On a 2026-07-28 connection (``MCPServer.http(protocol="auto")``) a server does not send the
client requests of its own while a call runs; it answers the call with an
``InputRequiredResult`` — the questions (``elicitation/create``, ``sampling/createMessage``,
``roots/list``) and an opaque ``requestState`` — and the client calls again with the answers
and that state, byte for byte, under a new JSON-RPC id. The questions go to the same callbacks
as a 2025-11-25 server's requests (the session's elicitation, roots …), through the SDK's own
driver; on a 2025-11-25 session the call is the plain one.
"""

from __future__ import annotations

from typing import Any

__all__ = ["call_tool", "MAX_ROUNDS"]

#: how many times a server may ask again before the call fails (the SDK's default)
MAX_ROUNDS = 10


async def call_tool(session: Any, name: str, arguments: dict[str, Any], **kwargs: Any) -> Any:
    """``session.call_tool(name, arguments, **kwargs)``, answering the server's input rounds."""
    try:
        from mcp.client import ClientRequestContext
        from mcp.client._input_required import run_input_required_driver
        from mcp_types import InputRequiredResult
    except ImportError:  # an SDK without the 2026-07-28 protocol: no rounds to answer
        return await session.call_tool(name, arguments, **kwargs)
    if getattr(session, "discover_result", None) is None:  # the initialize handshake: no rounds
        return await session.call_tool(name, arguments, **kwargs)

    async def send(responses: Any, state: Any) -> Any:
        return await session.call_tool(name, arguments, input_responses=responses, request_state=state,
                                       allow_input_required=True, **kwargs)

    async def dispatch(key: str, request: Any) -> Any:
        meta = request.params.meta if request.params else None
        return await session.dispatch_input_request(
            ClientRequestContext(session=session, request_id=key, meta=meta), request)

    first = await send(None, None)
    if not isinstance(first, InputRequiredResult):
        return first
    return await run_input_required_driver(first, dispatch=dispatch, retry=send, max_rounds=MAX_ROUNDS)
