"""A process that runs one we0nb turn whose tool is an MCP server's, on a SqlPersistence.

Used by ``test_crash_mcp.py``, which kills it with SIGKILL (or kills its MCP server) and
resumes the session in a new process. The turn: step 1 calls the MCP tool ``--tool``
(``place_order``: no annotations, side effects; ``lookup``: readOnlyHint) with the value
"block" — the server writes its ledger line and then waits, the first time only — ("tea"
with ``--kill-at before_call``) and
step 2 answers "All done.". The server's ledger is the ground truth of what ran.

Kill points (``--kill-at``): ``before_call`` (the call is committed as running; the request
has not been sent: the worker prints ``POINT before_call`` and waits), ``none`` (the test
watches the ledger and kills the worker, or the server, while the call is in flight).
Output lines: ``POINT <name>``, ``RESULT <json>``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any, AsyncIterator

from we0nb import SqlPersistence, ToolPart, We0Agent, user_message
from we0nb.mcp import MCPServer
from we0nb.models.base import AssistantTurn, FinishEvent, Model, ModelRequest, TextDelta, ToolCallEvent

APP = Path(__file__).with_name("mcp_servers") / "app.py"


class PlanModel(Model):
    model_id = "mcp-crash-plan"
    context_window = None

    def __init__(self, tool: str, value: str) -> None:
        self.tool = tool
        self.value = value

    async def stream(self, request: ModelRequest) -> AsyncIterator[Any]:  # type: ignore[override]
        if any(isinstance(m, AssistantTurn) and m.tool_calls for m in request.messages):
            yield TextDelta("All done.")
            yield FinishEvent("stop")
            return
        arg = "item" if self.tool == "place_order" else "key"
        yield ToolCallEvent(f"call_1_{os.getpid()}", self.tool, {arg: self.value})
        yield FinishEvent("tool-calls")


def persistence(args: argparse.Namespace) -> SqlPersistence:
    class Killable(SqlPersistence):
        async def commit(self, writes: Any, **kw: Any) -> None:
            await super().commit(writes, **kw)
            for _message, parts, _view in writes:
                for part in parts:
                    if (args.kill_at == "before_call" and isinstance(part, ToolPart)
                            and part.state.status == "running"):
                        print("POINT before_call", flush=True)
                        await asyncio.Event().wait()

    return Killable(args.url, **({"schema": args.schema} if args.schema else {}))


async def main(args: argparse.Namespace) -> int:
    server = MCPServer.stdio(sys.executable, [str(APP), "--ledger", args.ledger], name="crash",
                             trust_annotations=args.trust)
    value = "tea" if args.kill_at == "before_call" else "block"  # (the server holds "block" the first time)
    agent = We0Agent(PlanModel(args.tool, value), tools=[server], persistence=persistence(args), flush_interval=0.0)
    async with agent:
        if args.mode == "prompt":
            result = await agent.invoke(mode="prompt", session_id=args.session,
                                        messages=[user_message("Go.")])
        else:
            result = await agent.invoke(mode="resume", session_id=args.session)
    print("RESULT " + json.dumps({"result": result.result, "text": result.text}), flush=True)
    await agent.persistence.close()
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--schema", default=None)
    ap.add_argument("--session", required=True)
    ap.add_argument("--mode", choices=("prompt", "resume"), required=True)
    ap.add_argument("--ledger", required=True)
    ap.add_argument("--tool", choices=("place_order", "lookup"), required=True)
    ap.add_argument("--trust", action="store_true")
    ap.add_argument("--kill-at", choices=("before_call", "none"), default="none")
    sys.exit(asyncio.run(main(ap.parse_args())))
