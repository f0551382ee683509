"""The demo's agent: two tools, a ledger that records every real order, and a model that
answers from the tool results it is given.

The model is a :class:`~we0nb.FunctionModel`, not a fixed script: it asks for the three
calls when the turn has none yet, and otherwise writes its answer from the tool results
in its request — so whatever the abort cut, its words say what the store says.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import json
import os
from pathlib import Path
from typing import Any, Optional

from ..engine import We0Agent
from ..models import FunctionModel, ModelRequest
from ..models.base import AssistantTurn, ToolResult, UserTurn
from ..persistence import Persistence
from ..testing import text, tool_call
from ..tools import ToolContext, tool
from ._db import sqlite_file

__all__ = ["DEMO_PROMPT", "DEMO_TOOLS", "STOCK", "PLAN", "ANCHOR", "AT_MOST_ONCE_TITLE", "ledger_path", "read_ledger",
           "place", "demo_tools", "demo_model", "demo_agent"]

DEMO_PROMPT = "Order 2 coffee, check whether tea is in stock, and order 1 tea."
DEMO_TOOLS = ("place_order", "check_stock")
STOCK = {"coffee": 40, "tea": 14, "cocoa": 0}
#: the calls the model makes for DEMO_PROMPT, in order
PLAN = (("place_order", {"item": "coffee", "quantity": 2}), ("check_stock", {"item": "tea"}),
        ("place_order", {"item": "tea", "quantity": 1}))
#: the call the demo's abort timer starts from: the tea order (the ledger takes it at once, then
#: the supplier's confirmation takes ``confirm_seconds``)
ANCHOR = PLAN[2]
#: the title of a session made with ``--at-most-once`` (how ``we0nb resume`` knows the tool it had)
AT_MOST_ONCE_TITLE = "we0nb demo --at-most-once"


def ledger_path(db_url: str) -> Path:
    """Where ``place_order`` records each order it really places: a JSON-lines file beside the database."""
    f = sqlite_file(db_url) if db_url.startswith("sqlite") else None
    if f is not None:
        return f.with_name(f.stem + ".orders.jsonl")
    return Path("we0nb-demo.orders.jsonl")


def read_ledger(path: Path, session_id: Optional[str] = None) -> list[dict[str, Any]]:
    """The orders recorded in ``path`` (those of ``session_id`` only, when given); a torn last line is skipped."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except ValueError:  # a line cut by a kill while it was written
            continue
        if isinstance(row, dict) and (session_id is None or row.get("session_id") == session_id):
            rows.append(row)
    return rows


def place(ledger: Path, key: str, session_id: str, item: str, quantity: int, attempt: int) -> dict[str, Any]:
    """The supplier's side of an order: one line in the ledger per idempotency key. An order sent
    again with a key the ledger holds is not placed again: its first line is the answer (as a
    payments API that deduplicates on an ``Idempotency-Key`` answers)."""
    for row in read_ledger(ledger):
        if row.get("key") == key:
            return row
    row = {"order_id": f"ord-{len(read_ledger(ledger)) + 1:04d}", "session_id": session_id, "item": item,
           "quantity": quantity, "key": key, "attempt": attempt, "pid": os.getpid(),
           "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    ledger.parent.mkdir(parents=True, exist_ok=True)
    with ledger.open("a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
    return row


def demo_tools(ledger: Path, session_id: str, *, stock_seconds: float = 0.6, confirm_seconds: float = 0.5,
               approve: bool = False, exactly_once: bool = True) -> list:
    """``place_order`` (side effects: the ledger places the order) and ``check_stock`` (read-only).
    ``exactly_once``: place_order is ``idempotent`` — it sends its call's idempotency key and the
    ledger places one order per key, so a resume runs an unfinished order again safely; without
    it (``we0nb demo --at-most-once``) it is a plain side-effect tool, never run twice.
    ``approve``: every ``place_order`` call waits for a person's approval (``we0nb demo --approve``)."""

    @tool(requires_approval=approve, idempotent=exactly_once)
    async def place_order(item: str, quantity: int, ctx: ToolContext) -> str:
        """Place an order with the supplier (a side effect). The supplier takes it at once, then confirms."""
        row = place(ledger, ctx.idempotency_key, session_id, item, quantity, ctx.attempt)
        await asyncio.sleep(confirm_seconds)  # the supplier's confirmation
        return f"Order {row['order_id']} placed: {row['quantity']} x {row['item']}."

    @tool(side_effects=False)
    async def check_stock(item: str) -> dict:
        """How many units of an item the warehouse holds. Read-only: safe to run again."""
        await asyncio.sleep(stock_seconds)
        return {"item": item, "in_stock": STOCK.get(item, 0)}

    return [place_order, check_stock]


def _current_turn(request: ModelRequest) -> list[Any]:
    last_user = max((i for i, m in enumerate(request.messages) if isinstance(m, UserTurn)), default=-1)
    return request.messages[last_user + 1:]


def _sentence(name: str, args: dict[str, Any], result: Optional[ToolResult]) -> str:
    item = args.get("item", "?")
    if result is None:
        return f"The {name} call for {item} has no result."
    if name == "check_stock" and not result.is_error:
        try:
            n = json.loads(result.content)["in_stock"]
        except (ValueError, KeyError, TypeError):
            return f"Stock of {item}: {result.content}"
        return f"{str(item).capitalize()}: {n} in stock."
    if not result.is_error:
        return result.content
    if name == "place_order" and "may have run" in result.content:
        return (f"The {item} order may have been placed: it was running when the run stopped, and it was not "
                "sent again. Check with the supplier before ordering it again.")
    if result.content.startswith("Denied by a person"):
        said = result.content.split(". The call was not executed")[0].removeprefix("Denied by a person")
        return f"The {item} order was denied by a person{said.replace(': ', ' (', 1) + ')' if said else ''}: not placed."
    what = "order" if name == "place_order" else "stock check"
    again = (f" Ordering has side effects, so it was not placed again: say 'order {item}' to try."
             if name == "place_order" else "")
    first = result.content.split(":")[0].split(".")[0].strip()
    return f"The {item} {what} did not complete ({first}).{again}"


def answer(request: ModelRequest) -> list:
    """The model's reply: the planned calls when the turn has none, else an answer from the results."""
    turn = _current_turn(request)
    calls = [c for m in turn if isinstance(m, AssistantTurn) for c in m.tool_calls]
    if not calls:
        return [text("I'll place the coffee order, check the tea stock, then order the tea."),
                *(tool_call(name, args) for name, args in PLAN)]
    results = {r.call_id: r for r in turn if isinstance(r, ToolResult)}
    return [text(" ".join(_sentence(c.name, c.input, results.get(c.call_id)) for c in calls))]


def demo_model(delay: float = 0.03) -> FunctionModel:
    return FunctionModel(answer, delay=delay, model_id="demo-model")


def demo_agent(persistence: Persistence, session_id: str, ledger: Path, *, delay: float = 0.03,
               stock_seconds: float = 0.6, approve: bool = False, exactly_once: bool = True) -> We0Agent:
    """The agent of ``we0nb demo`` and ``we0nb resume`` (``approve``: orders wait for a person;
    ``exactly_once=False``: place_order is a plain side-effect tool)."""
    tools = demo_tools(ledger, session_id, stock_seconds=stock_seconds, approve=approve, exactly_once=exactly_once)
    return We0Agent(demo_model(delay), tools=tools, persistence=persistence)
