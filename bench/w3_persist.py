"""W3 persist: the W2 workload (K steps, one trivial tool call each, then a final text) on
SqlPersistence over a SQLite file, against MemoryPersistence in the same run.

Runs alternate memory / SQLite so machine noise hits both alike. Prints ms per step
(min / median / max over the runs after a warm-up), the extra of SQLite over memory,
database bytes per step, and the flatness of the step cost (steps 1-20 vs the last 20).

Usage: ``python bench/w3_persist.py [--steps 200] [--runs 7] [--synchronous NORMAL|FULL]
[--url postgresql://…]`` (``--url`` adds a third contender, e.g. PostgreSQL).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time

from _stats import spread
import uuid
from typing import Any, Callable

from we0nb import MemoryPersistence, ScriptedModel, SqlPersistence, We0Agent, text, tool, tool_call, user_message


@tool(side_effects=False)
def ping(i: int) -> str:
    """A trivial tool."""
    return f"pong {i}"


def script(k: int) -> list:
    return [[tool_call("ping", {"i": i})] for i in range(k)] + [[text("All steps done.")]]


async def one_run(make: Callable[[], Any], k: int) -> tuple[float, list[float]]:
    p = make()
    await p.list_sessions()  # open the database (and create its tables) outside the timing
    agent = We0Agent(ScriptedModel(script(k)), tools=[ping], persistence=p, max_steps=k + 5)
    marks: list[float] = []
    t0 = time.perf_counter()
    async for ev in agent.stream(mode="prompt", session_id="ses_w3", messages=[user_message("go")]):
        if ev["type"] == "step-finish":
            marks.append(time.perf_counter())
    total = time.perf_counter() - t0
    steps = [b - a for a, b in zip([t0] + marks[:-1], marks)]
    await p.close()
    return total * 1000 / (k + 1), steps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--synchronous", default="NORMAL")
    ap.add_argument("--url", default=None, help="another database URL to measure too (e.g. PostgreSQL)")
    args = ap.parse_args()
    k = args.steps
    tmp = tempfile.mkdtemp(prefix="we0_w3_")
    sizes: list[int] = []
    counter = iter(range(10**6))

    def sqlite() -> SqlPersistence:
        path = os.path.join(tmp, f"w3_{next(counter)}.db")
        sqlite.last = path  # type: ignore[attr-defined]
        return SqlPersistence(f"sqlite:///{path}", synchronous=args.synchronous)

    contenders: dict[str, Callable[[], Any]] = {"memory": MemoryPersistence, "sqlite": sqlite}
    schemas: list[str] = []

    def other() -> SqlPersistence:
        schemas.append(f"we0bench_{uuid.uuid4().hex[:8]}")
        return SqlPersistence(args.url, schema=schemas[-1])

    if args.url:
        contenders["other"] = other
    results: dict[str, list[float]] = {name: [] for name in contenders}
    flat: dict[str, list[float]] = {name: [] for name in contenders}
    for i in range(args.runs + 1):  # run 0 is the warm-up
        for name, make in contenders.items():
            ms, steps = asyncio.run(one_run(make, k))
            if name == "sqlite":
                path = sqlite.last  # type: ignore[attr-defined]
                wal = path + "-wal"
                sizes.append(os.path.getsize(path) + (os.path.getsize(wal) if os.path.exists(wal) else 0))
            if i:
                results[name].append(ms)
                flat[name].append(statistics.median(steps[-20:]) / statistics.median(steps[:20]))
    if schemas:  # drop the throw-away PostgreSQL schemas
        eng = SqlPersistence(args.url, schema=schemas[0]).sync_engine()
        with eng.begin() as conn:
            for name in schemas:
                conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        eng.dispose()
    mem, sql = statistics.median(results["memory"]), statistics.median(results["sqlite"])
    print(f"W3 persist: {k} tool steps + 1 final step; {args.runs} runs after a warm-up "
          f"(SQLite synchronous={args.synchronous})")
    for name in contenders:
        print(f"  {name:7s} ms/step: {spread(results[name], 3, 6)}   last-20/first-20 step cost: "
              f"{statistics.median(flat[name]):.2f}x")
    print(f"  SQLite extra over memory: {sql - mem:+.3f} ms/step (target <= +0.3)")
    if "other" in contenders:
        print(f"  {args.url.split('@')[-1]} extra over memory: "
              f"{statistics.median(results['other']) - mem:+.3f} ms/step")
    per_step = statistics.median(sizes) / (k + 1)
    print(f"  SQLite database bytes (file + WAL, before checkpoint): {statistics.median(sizes) / 1e6:.2f} MB, "
          f"{per_step / 1024:.2f} KB/step")
    # the same database after a checkpoint: what the history really occupies
    import sqlite3

    conn = sqlite3.connect(sqlite.last)  # type: ignore[attr-defined]
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    size = os.path.getsize(sqlite.last)  # type: ignore[attr-defined]
    print(f"  SQLite database file after checkpoint: {size / 1e6:.2f} MB, {size / (k + 1) / 1024:.2f} KB/step "
          "(target <= 4 KB/step)")


if __name__ == "__main__":
    main()
