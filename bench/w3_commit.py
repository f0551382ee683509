"""W3 at the port: the writes of K tool steps as ``Persistence.commit`` calls, with and
without a lease (the conditional write renews the lease first, in the same transaction).

Each step makes the engine's three durability points: the assistant message and its
step-start part; the tool call as *running* (write-ahead); the tool's end with the step's
end. Runs alternate (no lease / lease) so machine noise hits both alike. Prints µs per
commit (min / median / max over the runs after a warm-up) and the lease's extra per step.

Usage: ``python bench/w3_commit.py [--steps 200] [--runs 9] [--url sqlite:///…|postgresql://…]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import uuid
from typing import Any, Optional

from _stats import spread

from we0nb import AssistantMessage, Session, SqlPersistence, StepFinishPart, StepStartPart, ToolPart, UserMessage
from we0nb._ids import new_id
from we0nb.messages import MessageTime, SessionTime, ToolStateCompleted, ToolStateRunning, ToolTime, Usage


def _steps(sid: str, k: int) -> list[list[tuple]]:
    """Per step, the three commits' write lists, made before the timing."""
    out = []
    for i in range(k):
        a = AssistantMessage(id=new_id("msg"), session_id=sid, time=MessageTime(created=1.0), parent_id="msg_u",
                             model_id="m", usage=Usage())
        mk = dict(session_id=sid, message_id=a.id)
        start = StepStartPart(id=new_id("prt"), time=1.0, **mk)
        running = ToolPart(id=new_id("prt"), call_id=f"c{i}", tool="ping",
                           state=ToolStateRunning(input={"i": i}, time=ToolTime(start=1.0)), **mk)
        done = running.model_copy(update={"state": ToolStateCompleted(input={"i": i}, output=f"pong {i}",
                                                                      time=ToolTime(start=1.0, end=1.1))})
        final = a.model_copy(update={"finish_reason": "tool-calls",
                                     "time": MessageTime(created=1.0, completed=1.1)})
        finish = StepFinishPart(id=new_id("prt"), reason="tool-calls", usage=Usage(), time=1.1, **mk)
        out.append([[(a, [start], None)], [(None, [running], None)], [(final, [done, finish], None)]])
    return out


async def one_run(url: str, k: int, with_lease: bool, schema: Optional[str]) -> float:
    p = SqlPersistence(url, schema=schema) if schema else SqlPersistence(url)
    sid = new_id("ses")
    await p.upsert_session(Session(id=sid, title="w3", time=SessionTime(created=1.0, updated=1.0)))
    await p.commit([(UserMessage(id="msg_u", session_id=sid, time=MessageTime(created=1.0)), [], None)])
    steps = _steps(sid, k)
    lease = await p.acquire_lease(sid, "run_bench") if with_lease else None
    t0 = time.perf_counter()
    for writes in steps:
        for w in writes:
            await p.commit(w, lease=lease)
    elapsed = time.perf_counter() - t0
    if lease is not None:
        await lease.release()
    await p.close()
    return elapsed * 1e6 / (3 * k)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--url", default=None, help="default: a SQLite file in a temporary folder")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="we0_w3c_")
    url = args.url or f"sqlite:///{os.path.join(tmp, 'w3c.db')}"
    schema = f"we0bench_{uuid.uuid4().hex[:8]}" if url.startswith("postgres") else None
    res: dict[bool, list[float]] = {False: [], True: []}
    for i in range(args.runs + 1):  # run 0 is the warm-up
        for with_lease in (False, True):
            us = asyncio.run(one_run(url, args.steps, with_lease, schema))
            if i:
                res[with_lease].append(us)
    if schema:
        eng = SqlPersistence(url, schema=schema).sync_engine()
        with eng.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        eng.dispose()
    print(f"W3 at the port: {args.steps} steps x 3 commits on {url.split('@')[-1]}; {args.runs} runs after a warm-up")
    print(f"  commit            µs: {spread(res[False], 1, 5)}")
    print(f"  commit(lease=)    µs: {spread(res[True], 1, 5)}")
    extra = statistics.median(res[True]) - statistics.median(res[False])
    print(f"  the lease's extra: {extra:+.1f} µs per commit, {3 * extra / 1000:+.3f} ms per step (3 commits)")


if __name__ == "__main__":
    main()
