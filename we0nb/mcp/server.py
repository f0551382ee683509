"""``MCPServer``: a Model Context Protocol server whose tools a :class:`~we0nb.We0Agent` calls.

Put it in ``tools=[...]``: it connects on first use (or ``async with server:``), lists its
tools, contributes them to the agent's tool table (refreshed when the server sends
``notifications/tools/list_changed``), starts again after it dies, and stops when closed
(``await agent.aclose()``, ``async with agent:``, ``await server.aclose()``). A process that
ends without closing it closes the server's stdin, which tells a stdio server to exit.

Connections are per event loop (a notebook's loop, or each ``asyncio.run``); each lives in a
task it owns (see :mod:`we0nb.mcp.connection`), so any task may use or close the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import weakref
from dataclasses import asdict
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

from .._extras import require
from ..errors import MCPServerError
from ..tools import ToolContext, ToolError, ToolPolicy
from .adapter import MCPTool, PolicyOptions, call_error, hidden_reason, make_tool
from .calls import call_once
from .client import ClientFeatures, ElicitationHandler, ProgressHandler, check_roots
from .connection import AUTH_HINT, Connection, list_tools
from .http import HttpWatch, http_transport
from .resources import RESOURCE_TOOL, resource_return, resource_tool

__all__ = ["MCPServer"]

log = logging.getLogger("we0nb.mcp")

ApprovalOption = Union[None, bool, Iterable[str]]


class MCPServer:
    """An MCP server as a source of tools; build it with :meth:`stdio` or :meth:`http`.

    Options (both constructors): ``trust_annotations`` (False: every tool has side effects;
    True: ``readOnlyHint: true`` makes a tool read-only, recalled on resume), ``policies``
    (the server's tool name -> :class:`~we0nb.ToolPolicy`, overriding anything), ``prefix``
    (prepended to the tool names the agent sees), ``timeout`` (seconds per call; None: no
    limit), ``requires_approval`` (True, or a set of the server's tool names, whose calls a
    person approves first), ``connect_timeout`` (seconds to start and initialize), ``name``
    (how messages name the server), ``resource_tool`` (True or a name: offer the model a
    read-only tool that reads the server's resources, see :mod:`we0nb.mcp.resources`). What the
    client offers the server — ``on_progress``, ``reset_timeout_on_progress``, ``elicitation``
    (a function, or ``"ask"``: a person answers), ``roots`` — is described in :mod:`we0nb.mcp.client`.
    """

    def __init__(self, *, kind: str, target: Any, name: str, trust_annotations: bool = False,
                 policies: Optional[Mapping[str, ToolPolicy]] = None, prefix: Optional[str] = None,
                 timeout: Optional[float] = 300.0, requires_approval: ApprovalOption = None,
                 connect_timeout: float = 30.0, on_progress: Optional[ProgressHandler] = None,
                 reset_timeout_on_progress: bool = False, elicitation: Optional[ElicitationHandler] = None,
                 roots: Optional[Sequence[Any]] = None, resource_tool: Union[bool, str] = False,
                 protocol: str = "legacy") -> None:
        require("mcp", "MCPServer", "mcp")  # a clear one-line error without the extra
        self.kind = kind
        if protocol not in ("legacy", "auto"):
            raise ValueError(f"MCPServer(protocol=...): expected 'legacy' or 'auto', got {protocol!r}.")
        #: how the connection agrees on the protocol (see :func:`we0nb.mcp.connection.handshake`)
        self.protocol = protocol
        self._target = target
        self.name = name
        self.prefix = _check_prefix(prefix)
        self.timeout = _check_seconds("timeout", timeout, allow_none=True)
        self.connect_timeout: float = _check_seconds("connect_timeout", connect_timeout, allow_none=False) or 30.0
        self.options = PolicyOptions(trust_annotations=_check_bool("trust_annotations", trust_annotations),
                                     policies=_check_policies(policies),
                                     requires_approval=_check_approval(requires_approval))
        self._conns: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Connection]" = weakref.WeakKeyDictionary()
        self._locks: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock]" = weakref.WeakKeyDictionary()
        self._tools: tuple[MCPTool, ...] = ()
        self._listed = False
        #: the server's tools that are not offered to the model (its own name -> why), as last listed
        self.hidden_tools: dict[str, str] = {}
        if on_progress is not None and not callable(on_progress):
            raise TypeError("MCPServer(on_progress=...): expected a function fn(progress) (sync or async).")
        self.on_progress = on_progress
        self.reset_timeout_on_progress = _check_bool("reset_timeout_on_progress", reset_timeout_on_progress)
        if not isinstance(resource_tool, (bool, str)) or resource_tool == "":
            raise TypeError("MCPServer(resource_tool=...): expected True, False, or the tool's name.")
        #: the name of the resources/read tool offered to the model (None: not offered)
        self.resource_tool_name: Optional[str] = (
            (resource_tool if isinstance(resource_tool, str) else RESOURCE_TOOL) if resource_tool else None)
        self.features = ClientFeatures(self.label, elicitation=elicitation, roots=check_roots(roots),
                                       roots_enabled=roots is not None)

    # ------------------------------------------------------------------ constructors

    @classmethod
    def stdio(cls, command: str, args: Sequence[str] = (), *, env: Optional[Mapping[str, str]] = None,
              cwd: Optional[Union[str, os.PathLike[str]]] = None, name: Optional[str] = None,
              trust_annotations: bool = False, policies: Optional[Mapping[str, ToolPolicy]] = None,
              prefix: Optional[str] = None, timeout: Optional[float] = 300.0,
              requires_approval: ApprovalOption = None, connect_timeout: float = 30.0,
             on_progress: Optional[ProgressHandler] = None, reset_timeout_on_progress: bool = False,
              elicitation: Optional[ElicitationHandler] = None, roots: Optional[Sequence[Any]] = None,
              resource_tool: Union[bool, str] = False) -> "MCPServer":
        """A server run as a subprocess (``command`` with ``args``), speaking MCP over its stdin/stdout.

        ``env`` is added to the SDK's minimal environment (HOME, PATH, …); the server's stderr
        goes to this process's stderr.
        """
        if not isinstance(command, str) or not command:
            raise TypeError("MCPServer.stdio(command): expected the program to run, e.g. 'npx' or sys.executable.")
        if isinstance(args, str) or not all(isinstance(a, str) for a in args):
            raise TypeError("MCPServer.stdio(args=...): expected a list of strings, e.g. ['server.py'].")
        target = {"command": command, "args": list(args), "env": dict(env) if env else None,
                  "cwd": os.fspath(cwd) if cwd is not None else None}
        label = name or " ".join([os.path.basename(command), *[os.path.basename(a) for a in args
                                                              if not a.startswith("-")][:1]])
        return cls(kind="stdio", target=target, name=label, trust_annotations=trust_annotations, policies=policies,
                   prefix=prefix, timeout=timeout, requires_approval=requires_approval,
                   connect_timeout=connect_timeout, on_progress=on_progress,
                   reset_timeout_on_progress=reset_timeout_on_progress, elicitation=elicitation, roots=roots,
                   resource_tool=resource_tool)

    @classmethod
    def http(cls, url: str, *, headers: Optional[Mapping[str, str]] = None, auth: Any = None,
             name: Optional[str] = None,
             trust_annotations: bool = False, policies: Optional[Mapping[str, ToolPolicy]] = None,
             prefix: Optional[str] = None, timeout: Optional[float] = 300.0,
             requires_approval: ApprovalOption = None, connect_timeout: float = 30.0,
             on_progress: Optional[ProgressHandler] = None, reset_timeout_on_progress: bool = False,
             elicitation: Optional[ElicitationHandler] = None, roots: Optional[Sequence[Any]] = None,
             resource_tool: Union[bool, str] = False, protocol: str = "legacy") -> "MCPServer":
        """A server reached over MCP's streamable HTTP transport at ``url``.

        ``headers`` go on every request; ``auth`` is any ``httpx2.Auth`` (the HTTP client the
        SDK uses) — a token scheme of your own, or the SDK's ``OAuthClientProvider`` for OAuth 2.1.
        A 401 or 403 is reported as an authorization problem. ``protocol``: ``"legacy"`` (the
        ``initialize`` handshake, MCP 2025-11-25) or ``"auto"`` (MCP 2026-07-28's stateless
        requests where the server speaks it, probed with ``server/discover``; else the handshake).
        """
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"MCPServer.http(url): expected an http:// or https:// URL, got {url!r}.")
        target = {"url": url, "headers": dict(headers) if headers else None, "auth": _check_auth(auth)}
        return cls(kind="http", target=target, name=name or url, trust_annotations=trust_annotations,
                   policies=policies, prefix=prefix, timeout=timeout, requires_approval=requires_approval,
                   connect_timeout=connect_timeout, on_progress=on_progress,
                   reset_timeout_on_progress=reset_timeout_on_progress, elicitation=elicitation, roots=roots,
                   resource_tool=resource_tool, protocol=protocol)

    # ------------------------------------------------------------------ what the agent asks

    @property
    def label(self) -> str:
        return f"MCP server {self.name!r}"

    @property
    def hint(self) -> str:
        if self.kind == "stdio":
            t = self._target
            return f"Check that `{' '.join([t['command'], *t['args']])}` runs and speaks MCP on stdio."
        return f"Check that an MCP server answers streamable HTTP at {self._target['url']}."

    async def ensure_tools(self) -> tuple[MCPTool, ...]:
        """The server's tools, connecting first if needed (the same tuple while they do not change).

        The first connection's failure raises :class:`~we0nb.MCPServerError`; later, a server that
        cannot be restarted keeps its last tool list (its calls then fail with a clear error).
        """
        conn = self._live()
        try:
            if conn is None:
                conn = await self._connect()
            if conn.stale:
                conn.stale = False
                self._set_tools(await list_tools(conn.session))
        except Exception as e:
            if not self._listed:
                raise
            log.warning("%s: could not refresh its tools (%s); keeping the last list", self.label, e)
        return self._tools

    async def call_tool(self, name: str, arguments: dict[str, Any], *, context: Optional[ToolContext] = None) -> Any:
        """Call the server's tool ``name`` (its own name, without prefix); the result as a tool
        return value. Every failure is a :class:`~we0nb.tools.ToolError` with one clear line.

        ``context`` (the engine passes it) puts the call's idempotency key in the request's
        ``_meta`` as ``"io.we0nb/idempotency-key"``, so a server can deduplicate on it. An HTTP
        server that forgot our session (it restarted) gets a new session and the call again:
        it answered 404, so it did not process the call."""
        for again in (False, True):
            conn = await self._connection_for(name)
            try:
                return await call_once(self, conn.session, name, arguments, context)
            except ToolError:
                raise
            except Exception as e:
                if conn.watch.session_lost and not again and _refused(e):
                    log.info("%s forgot the MCP session (HTTP 404); starting a new one and calling %r again",
                             self.label, name)
                    conn.end("the server forgot the MCP session (HTTP 404)")
                    continue
                raise self._failure(e, conn, name) from None
        raise AssertionError("unreachable")  # pragma: no cover

    async def read_resource(self, uri: str) -> Any:
        """The resource at ``uri`` (``resources/read``) as a tool return value: text as output,
        blobs as file attachments. Failures are a :class:`~we0nb.tools.ToolError`, as for calls."""
        for again in (False, True):
            conn = await self._connection_for("resources/read")
            try:
                result = await asyncio.wait_for(conn.session.read_resource(uri), self.timeout)
            except Exception as e:
                if conn.watch.session_lost and not again and _refused(e):
                    conn.end("the server forgot the MCP session (HTTP 404)")
                    continue
                raise self._failure(e, conn, "resources/read") from None
            return resource_return(result)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _connection_for(self, name: str) -> Connection:
        conn = self._live()
        if conn is not None:
            return conn
        try:
            return await self._connect()
        except MCPServerError as e:
            raise ToolError(f"{e} The call to {name!r} was not made.", {"mcp_error": "unavailable"}) from None

    def _failure(self, e: BaseException, conn: Connection, name: str) -> ToolError:
        """What a failed call becomes (and the connection ended when it cannot be used again)."""
        again = ("The server is started again on the next call." if self.kind == "stdio"
                 else "It is reconnected on the next call.")
        if conn.watch.auth_failure is not None:
            conn.end(f"authorization failed ({conn.watch.auth_failure})")
            return ToolError(f"{self.label} refused the call to {name!r}: {conn.watch.auth_failure} — an authorization "
                             f"problem. {AUTH_HINT}", {"mcp_error": "unauthorized"})
        err = call_error(e, self.label, name, self.timeout, conn.dead, again)
        if err.metadata.get("mcp_error") == "connection_closed":
            conn.end(conn.dead or "the connection was closed")
        elif conn.watch.session_lost:
            conn.end("the server forgot the MCP session (HTTP 404)")
        return err

    # ------------------------------------------------------------------ the effective policies

    def policies(self) -> dict[str, ToolPolicy]:
        """The effective policy of each tool, by the name the agent sees (as last listed)."""
        self._check_listed("policies")
        return {t.name: t.policy for t in self._tools}

    def policy_table(self) -> list[dict[str, Any]]:
        """One row per tool: names, effective policy, why, and the annotations the server sent."""
        self._check_listed("policy_table")
        rows = []
        for t in self._tools:
            pol = asdict(t.policy)
            if callable(pol["requires_approval"]):
                pol["requires_approval"] = "rule"
            rows.append({"tool": t.name, "mcp_name": t.remote_name, **pol, "why": t.policy_source,
                         **{h: v for h, v in t.annotations.items()}})
        return rows

    async def set_roots(self, roots: Sequence[Any]) -> None:
        """Change the folders the server may see (``roots=``) and tell a connected server
        (``notifications/roots/list_changed``); it asks for the new list when it needs it."""
        if not self.features.roots_enabled:
            raise RuntimeError(f"{self.label} was built without roots=, so it did not declare the roots capability; "
                               "build it with roots=[...] (an empty list is fine) to change them later.")
        self.features.roots = check_roots(roots)
        conn = self._live()
        if conn is not None:
            import mcp_types

            await conn.session.send_notification(mcp_types.RootsListChangedNotification())

    # ------------------------------------------------------------------ lifetime

    async def connect(self) -> "MCPServer":
        """Connect now (it also happens on first use); returns the server."""
        await self.ensure_tools()
        return self

    @property
    def connected(self) -> bool:
        """Whether this event loop has a live connection to the server."""
        return self._live() is not None

    async def aclose(self) -> None:
        """Disconnect (a stdio server's process ends); the server connects again if used again."""
        here = _running_loop()
        conns = list(self._conns.items())
        self._conns.clear()
        for loop, conn in conns:
            if loop is here:
                await conn.close()
            elif not loop.is_closed():  # a connection made in another thread's loop
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(conn.end, "closed")

    async def __aenter__(self) -> "MCPServer":
        return await self.connect()

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        state = "connected" if self.connected else "not connected"
        return f"MCPServer({self.kind}, name={self.name!r}, {len(self._tools)} tools, {state})"

    def _repr_html_(self) -> str:
        from .html import server_html

        return server_html(self)

    # ------------------------------------------------------------------ internals

    def transport(self, watch: HttpWatch) -> Any:
        """The SDK transport for this server (an async context manager of the stream pair);
        ``watch`` learns what HTTP answers say (a forgotten session, a refused authorization)."""
        t = self._target
        if self.kind == "stdio":
            import mcp

            params = mcp.StdioServerParameters(command=t["command"], args=t["args"], env=t["env"], cwd=t["cwd"])
            return mcp.stdio_client(params, errlog=_errlog())
        return http_transport(t["url"], t["headers"], t["auth"], watch)

    def _live(self) -> Optional[Connection]:
        loop = _running_loop()
        conn = self._conns.get(loop) if loop is not None else None
        return conn if conn is not None and conn.usable else None

    async def _connect(self) -> Connection:
        loop = asyncio.get_running_loop()
        lock = self._locks.get(loop)
        if lock is None:
            lock = self._locks[loop] = asyncio.Lock()
        async with lock:
            conn = self._live()
            if conn is not None:
                return conn
            for gone in [lp for lp in self._conns if lp.is_closed()]:  # ended loops (asyncio.run): forget them
                del self._conns[gone]  # (a connection's task refers to its loop: no weak key would drop it)
            old = self._conns.pop(loop, None)
            if old is not None:  # it died: wait until its transport is down, then start again
                await old.close()
            conn = Connection(self)
            self._conns[loop] = conn
            try:
                tools = await conn.ready()
            except BaseException:
                self._conns.pop(loop, None)
                await conn.close()
                raise
            self._set_tools(tools)
            return conn

    def _set_tools(self, listed: list[Any]) -> None:
        opts, prefix = self.options, self.prefix or ""
        names = {t.name for t in listed}
        unknown = sorted((set(opts.policies) | (set() if isinstance(opts.requires_approval, bool)
                                                 else set(opts.requires_approval))) - names)
        if unknown:
            msg = (f"{self.label} has no tool named {', '.join(map(repr, unknown))} (named in policies= or "
                   f"requires_approval=); its tools: {', '.join(sorted(names)) or '(none)'}. Use the server's "
                   "own names, without prefix=.")
            if not self._listed:
                raise ValueError(msg)
            log.warning(msg)
        hidden = {t.name: why for t in listed if (why := hidden_reason(t)) is not None}
        for name in sorted(hidden.keys() - self.hidden_tools.keys()):
            log.warning("%s: tool %r is not offered to the model: %s", self.label, name, hidden[name])
        self.hidden_tools = hidden
        tools = tuple(make_tool(self, t, opts, prefix) for t in listed if t.name not in hidden)
        if self.resource_tool_name is not None:
            tools += (resource_tool(self, prefix + self.resource_tool_name),)
        if [(t.name, t.policy, t.input_schema, t.description) for t in tools] != \
                [(t.name, t.policy, t.input_schema, t.description) for t in self._tools] or not self._listed:
            self._tools = tools  # a new tuple only on a change: the agent rebuilds its table then
        self._listed = True

    def _check_listed(self, what: str) -> None:
        if not self._listed:
            raise RuntimeError(f"{self.label} has not listed its tools yet: connect first "
                               f"(`await server.connect()` or `async with server:`), then call {what}().")


def _refused(e: BaseException) -> bool:
    """Whether a failed request was answered with a JSON-RPC error (not a timeout or a dropped
    connection): after a 404 for our session, that answer means the request was not processed."""
    from mcp.shared.exceptions import MCPError
    from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

    return isinstance(e, MCPError) and e.error.code not in (CONNECTION_CLOSED, REQUEST_TIMEOUT)


def _errlog() -> Any:
    """Where a stdio server's stderr goes: this process's real stderr (a file descriptor)."""
    for stream in (sys.stderr, sys.__stderr__):
        try:
            if stream is not None:
                stream.fileno()
                return stream
        except (AttributeError, OSError, ValueError):
            continue
    import subprocess

    return subprocess.DEVNULL


def _running_loop() -> Optional[asyncio.AbstractEventLoop]:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


# --------------------------------------------------------------------------- option checks


def _check_auth(auth: Any) -> Any:
    if auth is None:
        return None
    import httpx2

    if not isinstance(auth, httpx2.Auth):
        raise TypeError(f"MCPServer.http(auth=...): expected an httpx2.Auth (e.g. the SDK's OAuthClientProvider), "
                        f"got {type(auth).__name__}; for a fixed token use headers={{'Authorization': 'Bearer …'}}.")
    return auth


def _check_prefix(prefix: Any) -> Optional[str]:
    if prefix is not None and (not isinstance(prefix, str) or not prefix):
        raise TypeError("MCPServer(prefix=...): expected a non-empty string such as 'files_', or None.")
    return prefix


def _check_seconds(what: str, value: Any, *, allow_none: bool) -> Optional[float]:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        none = " or None (no limit)" if allow_none else ""
        raise ValueError(f"MCPServer({what}=...): expected seconds > 0{none}, got {value!r}.")
    return float(value)


def _check_bool(what: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"MCPServer({what}=...): expected True or False, got {value!r}.")
    return value


def _check_policies(policies: Any) -> dict[str, ToolPolicy]:
    if policies is None:
        return {}
    if not isinstance(policies, Mapping) or not all(
            isinstance(k, str) and isinstance(v, ToolPolicy) for k, v in policies.items()):
        raise TypeError("MCPServer(policies=...): expected a dict of the server's tool names to ToolPolicy, "
                        "e.g. {'read_file': ToolPolicy(side_effects=False)}.")
    return dict(policies)


def _check_approval(value: Any) -> Union[bool, frozenset[str]]:
    if value is None or isinstance(value, bool):
        return bool(value)
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise TypeError("MCPServer(requires_approval=...): expected True, False, or a set of the server's tool "
                        "names (before prefix=), e.g. {'delete_file'}.")
    names = frozenset(value)
    if not all(isinstance(n, str) for n in names):
        raise TypeError("MCPServer(requires_approval=...): the set must hold tool names (strings).")
    return names
