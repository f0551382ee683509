"""W8 of shared/BENCH.md: a trivial MCP tool over stdio, through we0nb vs a bare SDK client.

Each round makes N sequential calls of ``echo`` to one server process (its own, per client):
  bare   the official SDK's ``ClientSession.call_tool`` (the baseline, same run)
  we0nb  what the engine does per call: ``validate_input`` (the tool's inputSchema),
         ``call`` (MCPServer.call_tool: the session call and the result conversion), ``to_output``
  agent  (information) a whole We0Agent run of N steps, each calling echo (engine + MCP)
  pydantic-ai  ``MCPToolset.direct_call_tool`` (pydantic-ai 2.x), when pydantic-ai is installed
Clients alternate order each round; the client's CPU is ``time.process_time()`` (the servers
are other processes). Start-up: process spawn + initialize + tools/list, until callable.

Usage: python bench/w8_mcp.py [--rounds 7] [--calls 1000] [--no-agent]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

from _stats import spread

SERVER = str(Path(__file__).with_name("_mcp_echo_server.py"))
ARGS = {"text": "hello"}


async def timed(n: int, call: Callable[[], Awaitable[Any]]) -> tuple[float, float]:
    """(wall ms per call, client CPU ms per call) of n sequential calls."""
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(n):
        await call()
    return (time.perf_counter() - t0) / n * 1e3, (time.process_time() - c0) / n * 1e3


class Bare:
    name = "bare mcp ClientSession.call_tool"

    async def start(self) -> None:
        from contextlib import AsyncExitStack

        from mcp import ClientSession, StdioServerParameters, stdio_client

        self.stack = AsyncExitStack()
        read, write = await self.stack.enter_async_context(
            stdio_client(StdioServerParameters(command=sys.executable, args=[SERVER])))
        self.session = await self.stack.enter_async_context(ClientSession(read, write))
        await self.session.initialize()
        await self.session.list_tools()

    async def call(self) -> Any:
        return await self.session.call_tool("echo", ARGS)

    async def stop(self) -> None:
        await self.stack.aclose()


class We0:
    name = "we0nb MCPServer tool (validate + call + output)"

    async def start(self) -> None:
        from we0nb.mcp import MCPServer
        from we0nb.tools import to_output

        self.server = MCPServer.stdio(sys.executable, [SERVER])
        await self.server.connect()
        self.tool = next(t for t in self.server._tools if t.name == "echo")
        self.to_output = to_output

    async def call(self) -> Any:
        t = self.tool
        return self.to_output(await t.call(t.validate_input(ARGS)))

    async def stop(self) -> None:
        await self.server.aclose()


class PydanticAI:
    name = "pydantic-ai MCPToolset.direct_call_tool"

    async def start(self) -> None:
        from pydantic_ai.mcp import MCPToolset

        self.server = MCPToolset(Path(SERVER))  # a .py path: FastMCP runs it with python over stdio
        await self.server.__aenter__()
        await self.server.list_tools()

    async def call(self) -> Any:
        return await self.server.direct_call_tool("echo", ARGS)

    async def stop(self) -> None:
        await self.server.__aexit__(None, None, None)


async def agent_round(n: int) -> float:
    """ms per step of one agent run of n steps, each calling echo over MCP."""
    from we0nb import MemoryPersistence, ScriptedModel, We0Agent, text, tool_call, user_message
    from we0nb.mcp import MCPServer

    model = ScriptedModel([[tool_call("echo", ARGS)] for _ in range(n)] + [[text("done")]])
    async with We0Agent(model, tools=[MCPServer.stdio(sys.executable, [SERVER])], persistence=MemoryPersistence(),
                        max_steps=n + 5) as agent:
        await agent.tool_table()  # connected before the clock starts
        t0 = time.perf_counter()
        await agent.invoke(messages=[user_message("go")])
        return (time.perf_counter() - t0) / (n + 1) * 1e3


def clients() -> list[type]:
    found = [Bare, We0]
    try:
        import pydantic_ai.mcp  # noqa: F401
    except ImportError:
        print("(pydantic-ai is not installed: its row is skipped)")
    else:
        found.append(PydanticAI)
    return found


async def startup(cls: type) -> float:
    c = cls()
    t0 = time.perf_counter()
    await c.start()
    ms = (time.perf_counter() - t0) * 1e3
    await c.stop()
    return ms


async def run(a: argparse.Namespace) -> None:
    kinds = clients()
    live = {cls: cls() for cls in kinds}
    for c in live.values():
        await c.start()
        await timed(100, c.call)  # warm-up
    wall: dict[type, list[float]] = {cls: [] for cls in kinds}
    cpu: dict[type, list[float]] = {cls: [] for cls in kinds}
    for r in range(a.rounds):
        order = kinds if r % 2 == 0 else list(reversed(kinds))
        for cls in order:
            w, c = await timed(a.calls, live[cls].call)
            wall[cls].append(w)
            cpu[cls].append(c)
    for c in live.values():
        await c.stop()
    starts: dict[type, list[float]] = {cls: [] for cls in kinds}
    for r in range(max(3, a.rounds // 2)):
        for cls in kinds if r % 2 == 0 else list(reversed(kinds)):
            starts[cls].append(await startup(cls))

    print(f"W8 MCP, {a.calls} sequential echo calls over stdio, {a.rounds} rounds (median per round)")
    base_w, base_c = statistics.median(wall[Bare]), statistics.median(cpu[Bare])
    for cls in kinds:
        mw, mc = statistics.median(wall[cls]), statistics.median(cpu[cls])
        extra = "" if cls is Bare else f"   over bare: {mw - base_w:+.3f} ms wall, {mc - base_c:+.3f} ms CPU"
        print(f"  {cls.name}")
        print(f"    wall {spread(wall[cls], 3)} ms/call   CPU {spread(cpu[cls], 3)} ms/call{extra}")
        print(f"    start-up {spread(starts[cls], 0)} ms")
    if not a.no_agent:
        steps = [await agent_round(a.calls) for _ in range(max(3, a.rounds // 2))]
        print(f"  we0nb agent run, {a.calls} steps each calling echo: {spread(steps, 3)} ms/step")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--no-agent", action="store_true")
    asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    main()
