"""A small MCP server written with the official SDK's high-level server, for the tests.

Run as a real process: over stdio (``python app.py --ledger L``) or streamable HTTP
(``python app.py --ledger L --http PORT``). Each execution of a tool body that matters
appends one JSON line to the ledger (the ground truth of what ran), with the server's PID.

Tools: ``echo`` and ``lookup`` (annotated readOnlyHint), ``place_order`` (no annotations:
side effects), ``slow`` (sleeps; notes a cancellation in the ledger), ``fail`` (isError),
``charge`` (idempotentHint; records the idempotency key sent in ``_meta``), ``structured`` (structuredContent), ``picture``/``clip``/``links`` (image, audio, resource
link), ``embedded`` (embedded resources with annotations), ``die`` (the process exits mid-call), ``garbage`` (writes a non-JSON line to stdout),
``report`` (listed as task-required), ``countdown`` (progress), ``ask``/``visit`` (form and URL
elicitation), ``ask_resolved`` (an elicitation by the SDK's resolver: input rounds on 2026-07-28), ``ask_badly`` (an elicitation with a malformed schema), ``folders`` (the client's roots), ``chatty`` (log messages), ``flood`` (progress and logs as fast as it can), ``grow`` (adds a tool and sends notifications/tools/list_changed), ``whoami`` (its PID); the resource ``notes://today``.
An item or key ``"block"`` makes ``place_order``/``lookup``/``charge`` write the ledger, then wait forever —
the first time only (a file beside the ledger remembers it), so a recalled call finishes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from typing import Annotated, TypedDict

from pydantic import BaseModel

from mcp.server.mcpserver import Audio, Context, Elicit, Image, MCPServer, Resolve
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import (Annotations, BlobResourceContents, EmbeddedResource, ResourceLink, TextContent,
                       TextResourceContents, ToolAnnotations, ToolExecution)

READ_ONLY = ToolAnnotations(read_only_hint=True)


class Square(TypedDict):
    n: int
    square: int


class _Server(MCPServer):
    """The SDK's server, listing ``report`` as a tool that must be called as a task (2025-11-25)."""

    async def list_tools(self) -> list:
        tools = await super().list_tools()
        return [t.model_copy(update={"execution": ToolExecution(task_support="required")}) if t.name == "report"
                else t for t in tools]


def build(ledger: str) -> MCPServer:
    app = _Server("we0nb-test")

    def note(tool: str, **data: object) -> None:
        with open(ledger, "a") as f:
            f.write(json.dumps({"tool": tool, "pid": os.getpid(), **data}) + "\n")
            f.flush()
            os.fsync(f.fileno())

    @app.tool(annotations=READ_ONLY)
    def echo(text: str) -> str:
        """Return the text unchanged."""
        return text

    async def hold(value: str) -> None:
        held = ledger + ".held"
        if value == "block" and not os.path.exists(held):
            open(held, "w").close()
            await asyncio.Event().wait()

    @app.tool(annotations=READ_ONLY)
    async def lookup(key: str) -> str:
        """Look a key up (read-only)."""
        note("lookup", key=key)
        await hold(key)
        return f"value of {key}"

    @app.tool()
    async def place_order(item: str, quantity: int = 1) -> str:
        """Place an order (a side effect: it is written to the ledger)."""
        note("place_order", item=item, quantity=quantity)
        await hold(item)
        return f"ordered {quantity} x {item}"

    @app.tool(annotations=READ_ONLY)
    async def slow(seconds: float) -> str:
        """Sleep, then answer."""
        note("slow", event="start")
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            note("slow", event="cancelled")
            raise
        return "slept"

    @app.tool(annotations=ToolAnnotations(idempotent_hint=True))
    async def charge(item: str, ctx: Context) -> str:
        """Charge for an item (idempotent: the client's key arrives in _meta; "block" hangs once)."""
        key = (ctx.request_context.meta or {}).get("io.we0nb/idempotency-key")
        note("charge", item=item, key=key)
        await hold(item)
        return f"charged {item} (key {key})"

    @app.tool()
    def report() -> str:
        """Listed with taskSupport "required": a client that cannot run tasks must not offer it."""
        note("report")
        return "report"

    @app.tool()
    def fail(message: str) -> str:
        """Always fails with the message."""
        raise ToolError(message)

    @app.tool()
    def structured(n: int) -> Square:
        """A structured result (structuredContent, with the same JSON as text)."""
        return {"n": n, "square": n * n}

    @app.tool()
    def picture() -> list:
        """A caption and a tiny PNG."""
        return ["a red dot", Image(data=b"\x89PNG\r\n\x1a\n-red-dot", format="png")]

    @app.tool()
    def clip() -> Audio:
        """A short audio clip."""
        return Audio(data=b"RIFF....WAVEfmt ", format="wav")

    @app.tool()
    def links() -> list:
        """Two documents, as resource links."""
        return [TextContent(type="text", text="two reports"),
                ResourceLink(type="resource_link", name="report.pdf", uri="https://example.org/report.pdf",
                             mime_type="application/pdf"),
                ResourceLink(type="resource_link", name="notes", uri="file:///tmp/notes.txt")]

    @app.tool()
    def embedded() -> list:
        """An embedded text resource and an embedded blob, with content annotations."""
        return [EmbeddedResource(type="resource", annotations=Annotations(audience=["user"], priority=0.5),
                                 resource=TextResourceContents(uri="file:///notes/a.md", mime_type="text/markdown",
                                                               text="# Notes")),
                EmbeddedResource(type="resource", resource=BlobResourceContents(
                    uri="file:///data/b.bin", mime_type="application/octet-stream", blob="AAEC"))]

    @app.tool()
    def die() -> str:
        """The server process exits in the middle of the call."""
        note("die")
        os._exit(3)

    @app.tool()
    async def garbage() -> str:
        """Writes a line that is not JSON-RPC to stdout, then never answers."""
        os.write(_wire_fd(), b"this is not JSON-RPC\n")
        await asyncio.Event().wait()
        return "unreachable"

    @app.tool()
    async def grow(name: str, ctx: Context) -> str:
        """Adds a tool named ``name`` and tells the client that the tool list changed."""
        def added() -> str:
            return f"{name} here"
        app.add_tool(added, name=name, description=f"The {name} tool.", annotations=READ_ONLY)
        await ctx.session.send_tool_list_changed()
        return f"added {name}"

    @app.tool(annotations=READ_ONLY)
    def header(name: str, ctx: Context) -> str:
        """The value of an HTTP request header (streamable HTTP only)."""
        return (ctx.headers or {}).get(name.lower(), "(none)")

    @app.tool(annotations=READ_ONLY)
    async def countdown(steps: int, delay: float, ctx: Context) -> str:
        """Reports progress (step i of steps, every ``delay`` seconds), then answers."""
        for i in range(1, steps + 1):
            await asyncio.sleep(delay)
            await ctx.report_progress(i, steps, f"step {i}")
        return f"counted {steps}"

    @app.tool(annotations=READ_ONLY)
    async def flood(count: int, ctx: Context) -> str:
        """Sends ``count`` progress notifications and as many log messages as fast as it can, then hangs."""
        note("flood", event="start")
        for i in range(count):
            await ctx.report_progress(i, count)
            await ctx.log("info", f"line {i}")
        note("flood", event="sent")
        await asyncio.Event().wait()
        return "unreachable"

    class Order(BaseModel):
        name: str
        count: int = 3

    @app.tool()
    async def ask(question: str, ctx: Context) -> str:
        """Asks the user (form elicitation: a name, and a count that defaults to 3)."""
        answer = await ctx.elicit(question, schema=Order)
        note("ask", action=answer.action, data=answer.data.model_dump() if answer.action == "accept" else None)
        return f"{answer.action}: {answer.data.model_dump() if answer.action == 'accept' else ''}"

    @app.tool()
    async def ask_resolved(question: str, order: Annotated[Contact, Resolve(who)], ctx: Context) -> str:
        """Asks the user through the SDK's resolver: a request mid-call on 2025-11-25, an
        InputRequiredResult (answered by calling again) on 2026-07-28."""
        note("ask_resolved", data=order.model_dump(), protocol=ctx.protocol_version)
        return f"accept: {order.model_dump()}"

    @app.tool()
    async def ask_badly(ctx: Context) -> str:
        """Asks with a schema that is not valid JSON Schema (a property whose type is 5)."""
        answer = await ctx.session.elicit_form("Broken form", {"type": "object", "properties": {"x": {"type": 5}}},
                                               related_request_id=ctx.request_id)
        note("ask_badly", action=answer.action)
        return answer.action

    @app.tool()
    async def visit(ctx: Context) -> str:
        """Asks the user to open a page (URL elicitation)."""
        answer = await ctx.elicit_url("Please sign in", "https://example.org/login", "e-1")
        return answer.action

    @app.tool(annotations=READ_ONLY)
    async def folders(ctx: Context) -> str:
        """The client's roots (their URIs, one a line)."""
        listed = await ctx.session.list_roots()
        return "\n".join(str(r.uri) for r in listed.roots)

    @app.tool(annotations=READ_ONLY)
    async def chatty(ctx: Context) -> str:
        """Sends two log messages (info, warning) to the client, then answers."""
        await ctx.log("info", "starting", logger_name="chatty")
        await ctx.log("warning", {"disk": "almost full"}, logger_name="chatty")
        return "said it"

    @app.resource("notes://today", mime_type="text/plain")
    def today() -> str:
        """Today's note (a resource, read with resources/read)."""
        return "buy tea"

    @app.tool(annotations=READ_ONLY)
    def whoami() -> int:
        """The server's process id."""
        return os.getpid()

    return app


def _wire_fd() -> int:
    """The descriptor of the real stdout pipe: the SDK moves it off fd 1 (which it points at
    stderr, so that stray prints cannot corrupt the protocol) — a broken server writes there."""
    from mcp.server import stdio

    claim = getattr(stdio, "_claims", {}).get(1)
    return claim.private_fd if claim is not None and claim.private_fd is not None else 1


class Contact(BaseModel):
    """What ``ask_resolved`` asks for (module level: the SDK reads its tools' annotations by name)."""

    name: str
    count: int = 3


def who(question: str) -> Elicit[Contact]:
    return Elicit(question, Contact)


def main() -> None:
    import warnings

    warnings.filterwarnings("ignore", message=r".*deprecated as of 2026-07-28")  # (logging and roots: still 2025-11-25)
    ap = argparse.ArgumentParser()
    ap.add_argument("--ledger", required=True)
    ap.add_argument("--http", type=int, default=None, help="serve streamable HTTP on 127.0.0.1:PORT")
    ap.add_argument("--token", default=None, help="HTTP only: answer 401 unless 'Authorization: Bearer TOKEN'")
    args = ap.parse_args()
    with open(args.ledger, "a") as f:
        f.write(json.dumps({"tool": "(start)", "pid": os.getpid()}) + "\n")
    app = build(args.ledger)
    if args.http is None:
        app.run()
    elif args.token is None:
        app.run("streamable-http", host="127.0.0.1", port=args.http)
    else:
        import uvicorn

        asgi = bearer_only(app.streamable_http_app(), args.token)
        uvicorn.run(asgi, host="127.0.0.1", port=args.http, log_level="warning")


def bearer_only(asgi, token: str):
    """The app behind a bearer-token check: 401 with a WWW-Authenticate challenge otherwise."""
    async def guarded(scope, receive, send):
        if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != f"Bearer {token}".encode():
            await send({"type": "http.response.start", "status": 401,
                        "headers": [(b"www-authenticate", b'Bearer error="invalid_token"'),
                                    (b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"unauthorized"})
            return
        await asgi(scope, receive, send)
    return guarded


if __name__ == "__main__":
    main()
