"""A process that runs (or continues) one batch and scores it (``test_scoring_sql.py``).

Prints ``RESULT <json>``: how many scores it wrote and skipped, and how many judge model calls it made.
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
    a = ap.parse_args()
    from we0nb import FunctionModel, SqlPersistence, We0Agent, judge, output, text
    from we0nb.batch.judge import Verdict

    calls: list[Any] = []

    def verdict(request: Any) -> list:
        calls.append(request)
        return [output(Verdict(passed=True, reason="ok"))]

    store = SqlPersistence(a.url)
    try:
        agent = We0Agent(FunctionModel(lambda r: [text("42")]), persistence=store)
        batch = await agent.batch([f"q{i}" for i in range(a.items)], name="shared", progress=False)
        got = await batch.score([lambda case: case.text == "42", judge(FunctionModel(verdict), "any")],
                                progress=False)
        print("RESULT " + json.dumps({"scored": len(got.scored), "skipped": got.skipped, "judged": len(calls)}))
    finally:
        await store.close()


if __name__ == "__main__":
    asyncio.run(main())
