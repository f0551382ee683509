"""MCP's streamable HTTP transport as we0nb uses it: one ``httpx2`` client per connection that
carries the user's ``headers=`` and ``auth=``, and watches the answers for what the SDK's
transport flattens into JSON-RPC errors:

- **404 to a request that carried an ``Mcp-Session-Id``** (or a 400 whose body names the
  session, as the TypeScript SDK's servers answer): the server forgot the session (it
  restarted, or expired it). The spec says the client MUST start a new session; the
  connection is marked ``lost`` and the server object starts a new one (and, for a
  ``tools/call`` the server refused this way, calls again: a 404 means it was not processed).
- **401 / 403**: an authorization problem, named as such (what to pass as ``auth=``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, AsyncIterator, Optional

__all__ = ["HttpWatch", "http_transport"]

SESSION_HEADER = "mcp-session-id"


@dataclass
class HttpWatch:
    """What the HTTP answers told the connection (read by :class:`~we0nb.mcp.connection.Connection`)."""

    #: the server answered 404 to a request of our session: it no longer knows it
    session_lost: bool = False
    #: the last 401/403 ("HTTP 401: <what the server said>"), None when none
    auth_failure: Optional[str] = None
    #: the MCP endpoint's path (answers from elsewhere — an authorization server — are not ours)
    path: str = ""

    async def on_response(self, response: Any) -> None:
        status = response.status_code
        if self.path and response.request.url.path != self.path:
            return
        ours = response.request.headers.get(SESSION_HEADER) and response.request.method != "DELETE"
        if ours and (status == 404 or (status == 400 and await _names_session(response))):
            self.session_lost = True
        elif status in (401, 403):
            challenge = response.headers.get("www-authenticate", "")
            self.auth_failure = f"HTTP {status}" + (f" ({challenge[:200]})" if challenge else "")
        else:
            self.auth_failure = None  # (an OAuth flow answers a 401 by signing in; what follows is the news)


async def _names_session(response: Any) -> bool:
    """Whether a 400 says our session id is not valid: what the TypeScript SDK's servers (the
    reference servers among them) answer where the spec says 404."""
    try:
        body = await response.aread()
    except Exception:
        return False
    return b"session" in body[:500].lower()


@contextlib.asynccontextmanager
async def http_transport(url: str, headers: Optional[dict[str, str]], auth: Any,
                         watch: HttpWatch) -> AsyncIterator[Any]:
    """The SDK's streamable HTTP client over our own ``httpx2`` client (headers, auth, the watch)."""
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    watch.path = httpx2.URL(url).path
    client = httpx2.AsyncClient(headers=headers or None, auth=auth, timeout=httpx2.Timeout(30.0, read=300.0),
                                event_hooks={"response": [watch.on_response]})
    async with client, streamable_http_client(url, http_client=client) as streams:
        yield streams
