"""W1 with SqlPersistence: one run streams N short text deltas then stops; consume
``agent.stream()`` to the end. Compared in the same run with MemoryPersistence and with a
bare async generator yielding the same N dicts (the floor).

The text is flushed on the agent's ``flush_interval`` (default 0.25 s: a kill loses at most
that much text), at part end and at step end — never one commit per delta.

Usage: ``python bench/w1_stream_sql.py [--deltas 10000] [--runs 7] [--flush-interval 0.25]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time

from _stats import spread
from typing import Any, Callable

from we0nb import MemoryPersistence, ScriptedModel, SqlPersistence, We0Agent, text, user_message


async def bare(n: int) -> float:
    async def gen():
        for i in range(n):
            yield {"type": "text-delta", "text": "tok ", "part_id": "prt_x"}

    t0 = time.perf_counter()
    async for _ in gen():
        pass
    return (time.perf_counter() - t0) * 1e6 / n


async def one_run(make: Callable[[], Any], n: int, flush: float) -> tuple[float, int]:
    p = make()
    await p.list_sessions()  # open the database (and create its tables) outside the timing
    agent = We0Agent(ScriptedModel([[text(["tok "] * n)]]), persistence=p, flush_interval=flush)
    deltas = 0
    t0 = time.perf_counter()
    async for ev in agent.stream(mode="prompt", session_id="ses_w1", messages=[user_message("stream")]):
        if ev["type"] == "text-delta":
            deltas += 1
    dt = time.perf_counter() - t0
    assert deltas == n
    tr = await p.load_transcript("ses_w1")
    assert tr.messages[-1].text == "tok " * n
    await p.close()
    return dt * 1e6 / n, deltas


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--deltas", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--flush-interval", type=float, default=0.25)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="we0_w1_")
    counter = iter(range(10**6))

    def sqlite() -> SqlPersistence:
        return SqlPersistence(f"sqlite:///{os.path.join(tmp, f'w1_{next(counter)}.db')}")

    res: dict[str, list[float]] = {"bare": [], "memory": [], "sqlite": []}
    for i in range(args.runs + 1):  # run 0 is the warm-up
        b = asyncio.run(bare(args.deltas))
        m, _ = asyncio.run(one_run(MemoryPersistence, args.deltas, args.flush_interval))
        s, _ = asyncio.run(one_run(sqlite, args.deltas, args.flush_interval))
        if i:
            res["bare"].append(b)
            res["memory"].append(m)
            res["sqlite"].append(s)
    bare_med = statistics.median(res["bare"])
    print(f"W1 stream: {args.deltas} deltas, flush_interval={args.flush_interval}s; "
          f"{args.runs} runs after a warm-up (µs per delta)")
    for name, xs in res.items():
        print(f"  {name:7s} {spread(xs, 2, 6)}   ratio to bare: {statistics.median(xs) / bare_med:6.1f}x")
    print("  targets (shared/BENCH.md): memory <= 4x bare, SqlPersistence <= 1 µs/delta")


if __name__ == "__main__":
    main()
