"""W12 (issue 34): experiments — a fork of a 1,000-message session, and scoring with a judge.

* ``fork``: ``agent.fork`` of a 1,000-message SQLite session (500 turns of a user message and an
  answer, a tool call in every other answer), timed per run; the issue's bar is ≤ 50 ms. Also
  ``memory`` for reference.
* ``score``: ``batch.score([judge(...)])`` of 2,000 finished items with a judge ``FunctionModel``
  sleeping 50 ms per verdict, at concurrency 100, on SQLite: ideal 2,000 / 100 × 50 ms = 1 s; the
  bar is ≤ 1.25 × the ideal, as W7's. Each run scores a fresh batch (the batch itself is made
  before the clock starts, with a model that answers at once).

Usage: python bench/w12_experiments.py [--only fork,score] [--runs 5] [--items 2000] [--concurrency 100]
Nothing is asserted; timings under load are not the machine's.
"""

from __future__ import annotations

import argparse
import statistics
import asyncio
import os
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(__file__))
from _stats import spread  # noqa: E402
from w11_fork import fork_agent  # noqa: E402

SLEEP = 0.05


async def _long_session(agent, sid: str, turns: int) -> None:
    from we0nb import user_message

    for i in range(turns):
        await agent.invoke(session_id=sid, messages=[user_message(f"question {i}")])


async def bench_fork(store: str, runs: int, messages: int) -> None:
    from we0nb import MemoryPersistence, SqlPersistence

    folder = tempfile.mkdtemp(prefix="w12-")
    p = SqlPersistence(f"sqlite:///{folder}/fork.db") if store == "sqlite" else MemoryPersistence()
    agent = fork_agent(p)
    sid = "ses_long"
    turns = 0
    while True:
        n = len((await agent.transcript(sid)).messages)
        if n >= messages:
            break
        await _long_session(agent, sid, 1)
        turns += 1
    n = len((await agent.transcript(sid)).messages)
    await agent.fork(sid)  # (warm-up: statements compiled, caches filled)
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        await agent.fork(sid)
        times.append((time.perf_counter() - t) * 1000)
    print(f"fork {store:7s} {n} messages: {spread(times, 1, 6, ' ms')}  (bar: 50 ms)")
    await p.close()


async def bench_score(runs: int, items: int, concurrency: int) -> None:
    from we0nb import FunctionModel, SqlPersistence, We0Agent, judge, output, text
    from we0nb.batch.judge import Verdict

    async def verdict(request):
        await asyncio.sleep(SLEEP)
        return [output(Verdict(passed=True, reason="ok"))]

    folder = tempfile.mkdtemp(prefix="w12-")
    p = SqlPersistence(f"sqlite:///{folder}/score.db")
    agent = We0Agent(FunctionModel(lambda r: [text("42")], keep_requests=False), persistence=p)
    ideal = items / concurrency * SLEEP
    walls = []
    for r in range(runs + 1):  # (the first is a warm-up)
        name = f"w12_{uuid.uuid4().hex[:8]}"
        batch = await agent.batch([f"q{i}" for i in range(items)], name=name, concurrency=concurrency,
                                  progress=False)
        j = judge(FunctionModel(verdict, keep_requests=False), "any answer passes")
        cpu = time.process_time()
        t = time.perf_counter()
        got = await batch.score([j], concurrency=concurrency, progress=False)
        wall = time.perf_counter() - t
        cpu = time.process_time() - cpu
        assert len(got.scored) == items and not got.errors
        if r:
            walls.append(wall)
            print(f"score run {r}: {wall:.2f} s = {wall / ideal:.2f}x ideal ({ideal:.2f} s), CPU {cpu / items * 1000:.2f} "
                  "ms/item")
    print(f"score sqlite {items} items, concurrency {concurrency}: {spread(walls, 2, 5, ' s')}  "
          f"ratio median {statistics.median(walls) / ideal:.2f}x (bar: 1.25x)")
    await p.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="fork,score")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--messages", type=int, default=1000)
    ap.add_argument("--items", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=100)
    a = ap.parse_args()
    only = set(a.only.split(","))
    if "fork" in only:
        for store in ("sqlite", "memory"):
            asyncio.run(bench_fork(store, a.runs, a.messages))
    if "score" in only:
        asyncio.run(bench_score(a.runs, a.items, a.concurrency))


if __name__ == "__main__":
    main()
