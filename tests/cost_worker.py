"""A process sharing one priced batch with others, under a budget (``test_cost.py``).

Each item: a lookup step, then an answer; each of the 2 calls reports 1,000 input tokens at
$1 per million ($0.002 per item) and takes ``--delay`` seconds. Prints ``RESULT <json>``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--items", type=int, required=True)
    ap.add_argument("--max-cost", type=float, required=True)
    ap.add_argument("--delay", type=float, default=0.1)
    a = ap.parse_args()
    from we0nb import FunctionModel, SqlPersistence, We0Agent, tool
    from we0nb.batch.runner import Budget
    from we0nb.testing import text, tool_call, usage

    Budget.READ_EVERY = 0.02  # (read the store's sum at almost every claim: what the test checks)

    @tool(side_effects=False)
    def look(q: str) -> str:
        return "seen"

    async def reply(request: Any) -> list:
        await asyncio.sleep(a.delay)
        if request.turn_steps == 0:
            return [tool_call("look", {"q": "x"}), usage(1000, 0)]
        return [text("done"), usage(1000, 0)]

    store = SqlPersistence(a.url)
    agent = We0Agent(FunctionModel(reply, price=(1.0, 1.0)), tools=[look], persistence=store)
    batch = await agent.batch([f"p{i}" for i in range(a.items)], name="shared", concurrency=1,
                              max_cost=a.max_cost, progress=False)
    print("RESULT " + json.dumps({"counts": batch.counts, "stopped": batch.stopped}), flush=True)
    await store.close()


if __name__ == "__main__":
    asyncio.run(main())
