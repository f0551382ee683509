"""W1 (stream) and W2 (tools) of shared/BENCH.md on MemoryPersistence.

W1: the model streams N short deltas; we consume ``agent.stream()`` to the end and
compare with a bare async generator yielding the same number of dicts (same run).
W2: K steps, each calling one trivial tool, then a final text; ms per step and the
cost of the first 20 steps vs the last 20 (history must not make steps slower).

W13: W2 with a tool that takes a ToolContext and is idempotent=True against a plain tool
(both with side effects: the write-ahead waits for both), on memory and on a SQLite file,
interleaved; ms per step and the ratio (within noise is the target).

Usage: python bench/w1_w2_engine.py [--runs 7] [--deltas 10000] [--steps 200] [--only w1,w2,w13]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time

from _stats import spread

from we0nb import (MemoryPersistence, ScriptedModel, SqlPersistence, ToolContext, We0Agent, text, tool, tool_call,
                   user_message)


async def bare(n: int) -> None:
    async def gen():
        for i in range(n):
            yield {"type": "text-delta", "text": "ab "}
    async for _ in gen():
        pass


async def w1_once(n: int, persistence_factory) -> float:
    model = ScriptedModel([[text(["ab "] * n)]])
    agent = We0Agent(model, persistence=persistence_factory())
    t0 = time.perf_counter()
    async for _ in agent.stream(messages=[user_message("go")]):
        pass
    return time.perf_counter() - t0


async def bare_once(n: int) -> float:
    t0 = time.perf_counter()
    await bare(n)
    return time.perf_counter() - t0


@tool(side_effects=False)
def ping(i: int) -> str:
    """A trivial tool."""
    return "pong"


@tool(side_effects=False)
async def aping(i: int) -> str:
    """A trivial async tool."""
    return "pong"


@tool
async def plain(i: int) -> str:
    """A trivial tool with side effects (the default)."""
    return "pong"


@tool(idempotent=True)
async def keyed(ctx: ToolContext, i: int) -> str:
    """The same, idempotent and reading its context (what a call to a deduplicating service does)."""
    return "pong" if ctx.idempotency_key else ""


async def w13_once(k: int, persistence, name: str) -> float:
    """ms per step of K steps calling ``name`` (``plain`` or ``keyed``)."""
    await persistence.list_sessions()  # (open a database outside the timing)
    model = ScriptedModel([[tool_call(name, {"i": i})] for i in range(k)] + [[text("done")]])
    agent = We0Agent(model, tools=[plain, keyed], persistence=persistence, max_steps=k + 5)
    t0 = time.perf_counter()
    async for _ in agent.stream(messages=[user_message("go")]):
        pass
    total = time.perf_counter() - t0
    await persistence.close()
    return total * 1e3 / (k + 1)


async def w13(k: int, runs: int) -> None:
    tmp = tempfile.mkdtemp(prefix="we0_w13_")
    counter = iter(range(10**6))

    def sqlite() -> SqlPersistence:
        return SqlPersistence(f"sqlite:///{os.path.join(tmp, f'w13_{next(counter)}.db')}")

    stores = {"memory": MemoryPersistence, "SQLite": sqlite}
    res: dict[tuple[str, str], list[float]] = {(s, n): [] for s in stores for n in ("plain", "keyed")}
    for i in range(runs + 1):  # run 0 is the warm-up; every variant in each round: the same noise
        for store, make in stores.items():
            for name in ("plain", "keyed"):
                ms = await w13_once(k, make(), name)
                if i:
                    res[(store, name)].append(ms)
    print(f"W13 exactly-once, K={k} steps, {runs} rounds (plain tool vs ToolContext + idempotent=True)")
    for store in stores:
        a, b = res[(store, "plain")], res[(store, "keyed")]
        print(f"  {store:7s} plain: {spread(a, 3)} ms/step   keyed: {spread(b, 3)} ms/step   "
              f"ratio of medians {statistics.median(b) / statistics.median(a):.3f}")


async def w2_once(k: int, persistence_factory, use_async: bool = True) -> tuple[float, list[float]]:
    name = "aping" if use_async else "ping"
    steps = [[tool_call(name, {"i": i})] for i in range(k)] + [[text("done")]]
    model = ScriptedModel(steps)
    agent = We0Agent(model, tools=[ping, aping], persistence=persistence_factory(), max_steps=k + 5)
    stamps: list[float] = []
    t0 = time.perf_counter()
    async for ev in agent.stream(messages=[user_message("go")]):
        if ev["type"] == "step-finish":
            stamps.append(time.perf_counter())
    total = time.perf_counter() - t0
    per = [b - a for a, b in zip([t0] + stamps[:-1], stamps)]
    return total, per


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--deltas", type=int, default=10_000)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--only", default="w1,w2,w13", help="which workloads, comma-separated")
    a = ap.parse_args()
    n, k = a.deltas, a.steps
    only = set(a.only.split(","))

    async def run() -> None:
        if "w1" in only:
            await run_w1()
        if "w2" in only:
            await run_w2()
        if "w13" in only:
            await w13(k, a.runs)

    async def run_w1() -> None:
        await w1_once(1000, MemoryPersistence)  # warm-up
        await bare_once(1000)
        ours, base = [], []
        for _ in range(a.runs):  # interleaved: the baseline shares the machine's noise
            base.append(await bare_once(n))
            ours.append(await w1_once(n, MemoryPersistence))
        print(f"W1 stream, N={n} deltas, MemoryPersistence, {a.runs} runs")
        print(f"  we0nb : {spread([t / n * 1e6 for t in ours], 3)} µs/delta")
        print(f"  bare  : {spread([t / n * 1e6 for t in base], 3)} µs/delta")
        print(f"  ratio (median we0nb / median bare): {statistics.median(ours) / statistics.median(base):.1f}x")

    async def run_w2() -> None:
        await w2_once(20, MemoryPersistence)
        totals, firsts, lasts = [], [], []
        for _ in range(a.runs):
            total, per = await w2_once(k, MemoryPersistence)
            totals.append(total / (k + 1))
            firsts.append(statistics.mean(per[:20]))
            lasts.append(statistics.mean(per[k - 20:k]))
        print(f"W2 tools, K={k} steps (async tool), MemoryPersistence, {a.runs} runs")
        print(f"  per step     : {spread([x * 1e3 for x in totals], 3)} ms/step")
        print(f"  steps 1-20   : {spread([x * 1e3 for x in firsts], 3)} ms/step")
        print(f"  steps {k-19}-{k}: {spread([x * 1e3 for x in lasts], 3)} ms/step")
        print(f"  growth (median last-20 / median first-20): {statistics.median(lasts) / statistics.median(firsts):.2f}x")
        totals = []
        for _ in range(max(3, a.runs // 2)):
            total, per = await w2_once(k, MemoryPersistence, use_async=False)
            totals.append(total / (k + 1))
        print(f"  sync tool (worker thread) per step: {spread([x * 1e3 for x in totals], 3)} ms/step")

    asyncio.run(run())


if __name__ == "__main__":
    main()
