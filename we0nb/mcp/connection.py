"""One live connection to an MCP server, in a task of its own.

The SDK's transports and ``ClientSession`` are anyio context managers whose cancel scopes
must be exited by the task that entered them. Notebook cells run in different tasks, so a
connection opened by one cell and closed by another would trip that rule. Here one task,
owned by the connection, enters the transport and the session, waits until asked to close,
and exits them; every other task only sends requests through the session (which the SDK
allows from any task). Closing means setting an event and waiting for that task.

The connection ends — and the next use connects again — when the server closes its end
(its process exited), when it sends something that is not an MCP message, or when asked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from types import TracebackType
from typing import Any, Callable, Optional

from ..errors import MCPServerError
from .endpoint import Endpoint
from .http import HttpWatch
from .sdk_logs import quiet_sdk_tracebacks

__all__ = ["Connection", "AUTH_HINT"]

log = logging.getLogger("we0nb.mcp")

AUTH_HINT = ("Pass credentials with MCPServer.http(url, headers={'Authorization': 'Bearer …'}) or "
             "auth= (an httpx2.Auth such as the SDK's OAuthClientProvider, or we0nb.mcp.oauth).")


class _Watched:
    """The transport's read stream, telling the connection when it ends (the server is gone)."""

    __slots__ = ("_inner", "_on_end")

    def __init__(self, inner: Any, on_end: Callable[[], None]) -> None:
        self._inner = inner
        self._on_end = on_end

    @property
    def last_context(self) -> Any:
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> Any:
        try:
            return await self._inner.receive()
        except Exception:
            self._on_end()
            raise

    def __aiter__(self) -> "_Watched":
        return self

    async def __anext__(self) -> Any:
        try:
            return await self._inner.__anext__()
        except (StopAsyncIteration, Exception):
            self._on_end()
            raise

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> "_Watched":
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, exc_type: Optional[type[BaseException]], exc_val: Optional[BaseException],
                        exc_tb: Optional[TracebackType]) -> Optional[bool]:
        return await self._inner.__aexit__(exc_type, exc_val, exc_tb)


class Connection:
    """A connection being opened, open, or ended (``dead`` says why); see the module docstring."""

    def __init__(self, server: Endpoint) -> None:
        self.server = server
        loop = asyncio.get_running_loop()
        self.session: Any = None
        #: why the connection ended (None while it is usable)
        self.dead: Optional[str] = None
        #: the server said its tool list changed (notifications/tools/list_changed)
        self.stale = False
        #: what the HTTP answers said (a forgotten session, an authorization failure)
        self.watch = HttpWatch()
        self._closing = asyncio.Event()
        self._ready: asyncio.Future[list[Any]] = loop.create_future()
        self.task = loop.create_task(self._main(), name=f"we0nb {server.label}")

    @property
    def usable(self) -> bool:
        return self.session is not None and self.dead is None and not self.watch.session_lost

    async def ready(self) -> list[Any]:
        """The server's tools once connected; MCPServerError when it could not be."""
        try:
            return await asyncio.shield(self._ready)
        except MCPServerError:
            raise
        except Exception as e:
            step = _oauth_failure(e)
            if step is not None:
                raise MCPServerError(f"{self.server.label}: authorization failed — {step}") from e
            if self.watch.auth_failure is not None:
                raise MCPServerError(f"{self.server.label} refused the connection: {self.watch.auth_failure} — an "
                                     f"authorization problem. {AUTH_HINT}") from e
            raise MCPServerError(f"{self.server.label} could not be started: {_describe(e)}. "
                                 f"{self.server.hint}") from e

    def end(self, reason: str) -> None:
        """Mark the connection ended and let its task close it (from this loop's thread)."""
        if self.dead is None:
            self.dead = reason
        self._closing.set()

    async def close(self) -> None:
        """Close and wait until the transport is down (the server process stopped). A connection
        still being opened is cancelled: an abort while a server answers nothing stops at once,
        not when ``connect_timeout`` runs out."""
        self.end("closed")
        if not self.task.done():
            if not self._ready.done():
                self.task.cancel()
            await asyncio.wait({self.task})
        if self._ready.done() and not self._ready.cancelled():
            self._ready.exception()  # (read: a connect given up is no "exception never retrieved" warning)

    async def _main(self) -> None:
        import anyio
        import mcp

        server = self.server
        quiet_sdk_tracebacks()
        try:
            async with contextlib.AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(server.transport(self.watch))
                session = await stack.enter_async_context(mcp.ClientSession(
                    _Watched(read, self._on_end_of_stream), write, message_handler=self._on_message,
                    client_info=mcp.Implementation(name="we0nb", version=_version()),
                    **server.features.session_kwargs()))
                with anyio.fail_after(server.connect_timeout):  # (innermost scope: exited in LIFO order)
                    await handshake(session, server.protocol)
                    tools = await list_tools(session)
                self.session = session
                self._ready.set_result(tools)
                await self._closing.wait()
        except BaseException as exc:
            e = _leaf(exc)
            if not self._ready.done():
                if isinstance(e, TimeoutError):
                    e = TimeoutError(f"no answer to initialize within connect_timeout={server.connect_timeout:g} s")
                self._ready.set_exception(e if isinstance(e, Exception) else MCPServerError(
                    f"{server.label}: connecting was cancelled."))
            elif not isinstance(e, asyncio.CancelledError):
                log.warning("%s: the connection ended with %s", server.label, _describe(e))
            if not isinstance(exc, Exception):
                raise
        finally:
            self.session = None
            if self.dead is None:
                self.dead = "closed"

    def _on_end_of_stream(self) -> None:
        self.end("the server closed the connection: its process exited, or it closed its stdout")

    async def _on_message(self, message: Any) -> None:
        """Server notifications and transport faults (the dispatcher's loop: never block here)."""
        if isinstance(message, Exception):
            # e.g. a line on stdout that is not JSON-RPC: the stream cannot be trusted any more
            self.end(f"it sent something that is not an MCP message: {_garbage(message)}")
            return
        method = getattr(message, "method", None)
        if method == "notifications/tools/list_changed":
            self.stale = True
        elif method == "notifications/resources/list_changed":
            log.info("%s: its resources changed (notifications/resources/list_changed)", self.server.label)


async def handshake(session: Any, protocol: str) -> None:
    """Agree on the protocol: ``"legacy"`` — the ``initialize`` handshake (MCP 2025-11-25 and
    before, a session the server keeps); ``"auto"`` — the SDK's own policy (what its ``Client``
    does by default): probe ``server/discover`` at the newest version (2026-07-28: every request
    stands alone, carrying the version, client info and capabilities in its ``_meta`` and the
    ``MCP-Protocol-Version`` / ``Mcp-Method`` / ``Mcp-Name`` headers), retry once at a version
    the server names, and fall back to ``initialize`` for a server that does not speak it."""
    if protocol == "auto":
        try:
            from mcp.client._probe import negotiate_auto
        except ImportError:  # an SDK without the 2026-07-28 protocol: the handshake is all there is
            pass
        else:
            await negotiate_auto(session)
            return
    await session.initialize()


async def list_tools(session: Any) -> list[Any]:
    """Every tool of the server (all pages of tools/list)."""
    import mcp_types

    tools: list[Any] = []
    cursor = None
    for _ in range(1000):
        params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await session.list_tools(params=params)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            return tools
    raise MCPServerError("tools/list kept returning a next cursor (1,000 pages); the server's pagination loops.")


def _oauth_failure(e: BaseException) -> Optional[str]:
    """The OAuth step that failed, when ``e`` is an OAuth flow's error (ours or the SDK's)."""
    from mcp.client.auth.exceptions import OAuthFlowError, OAuthRegistrationError, OAuthTokenError

    from .oauth import OAuthError

    if isinstance(e, OAuthError):
        return str(e)
    if isinstance(e, OAuthRegistrationError):
        return f"registering the client with the authorization server: {e}"
    if isinstance(e, OAuthTokenError):
        return f"getting or refreshing a token: {e}. Delete the token file (tokens=) to sign in again."
    if isinstance(e, OAuthFlowError):
        return f"OAuth flow: {e}"
    return None


def _leaf(e: BaseException) -> BaseException:
    """The error inside anyio's exception groups (the first one that is not a cancellation)."""
    while isinstance(getattr(e, "exceptions", None), tuple) and e.exceptions:  # type: ignore[attr-defined]
        inner = e.exceptions  # type: ignore[attr-defined]
        e = next((x for x in inner if not isinstance(x, asyncio.CancelledError)), inner[0])
    return e


def _garbage(e: Exception) -> str:
    """What the server sent instead of a message (the offending input when the SDK kept it)."""
    errors = getattr(e, "errors", None)
    if callable(errors):
        try:
            rows: Any = errors()  # (pydantic's list of error dicts; callable() narrowed it to an object)
            first = rows[0]
            return f"{str(first.get('input'))[:120]!r} ({first.get('msg')})"
        except Exception:  # pragma: no cover - not a pydantic error after all
            pass
    return _describe(e)


#: how the SDK words an answer it could not read as JSON-RPC (its text then quotes pydantic's errors)
_NOT_MCP = ("Failed to parse JSON response", "Failed to parse SSE message")


def _describe(e: BaseException) -> str:
    """``Type: text`` on one line (the first line of the text, at most 300 characters)."""
    text = str(e).strip()
    if text.startswith(_NOT_MCP):
        return "its answer is not an MCP message (JSON-RPC)"
    lines = text.splitlines()
    text = lines[0] if lines else ""
    if len(text) > 300:
        text = text[:300] + "…"
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("we0nb")
    except PackageNotFoundError:  # a checkout on sys.path, not installed
        return "0+unknown"
