"""W11 (issue 34): ``agent.fork(session_id, at=message_id)`` of a 1,000-message session at its
middle message; the bar is ≤ 50 ms on SQLite.

The session (a user message and one or two answers per turn, a tool call in every other turn)
is built once per database (``--db``: a SQLite file or a PostgreSQL URL; ``--schema`` for
PostgreSQL) and kept, so rounds in other processes fork the same session. Each run forks it at
its middle message and is timed (the forks are deleted afterwards, so every round starts from a
database of the same size); min / median / max are printed (the first fork is a warm-up),
and the median CPU time of this process per fork (less sensitive to other processes' load; on
PostgreSQL the server's work is not in it).

``--compare TREE`` times the code in TREE (a copy of another version's source tree, e.g. made
with ``git archive``) against this one, in interleaved rounds of separate processes on the same
database, and prints each side's median per round and the median of the rounds.

Usage: python bench/w11_fork.py [--db sqlite:///tmp/w11.db] [--schema S] [--runs 15] [--messages 1000]
       python bench/w11_fork.py --compare /tmp/old-tree [--rounds 5] ...
Nothing is asserted; timings under load are not the machine's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from _stats import spread  # noqa: E402

SID = "ses_w11"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fork_agent(p):
    """The agent that builds the long session (W11 here, and W12's fork): a tool call every other turn."""
    from we0nb import FunctionModel, We0Agent, text, tool, tool_call
    from we0nb.models.base import ToolResult

    @tool(side_effects=False)
    def look(q: str) -> str:
        return "seen " + q

    def reply(request):
        if request.turn_steps == 0 and len(request.messages) % 4 == 1:
            return [tool_call("look", {"q": "x"})]
        last = request.messages[-1]
        return [text("answer after " + ("a tool" if isinstance(last, ToolResult) else "a question"))]

    return We0Agent(FunctionModel(reply, keep_requests=False), tools=[look], persistence=p)


async def _built(agent, messages: int) -> list[str]:
    """The session's message ids, the session made first when it is shorter than ``messages``."""
    from we0nb import user_message

    ids = [m.info.id for m in (await agent.transcript(SID)).messages]
    while len(ids) < messages:
        await agent.invoke(session_id=SID, messages=[user_message(f"question {len(ids)}")])
        ids = [m.info.id for m in (await agent.transcript(SID)).messages]
    return ids


async def bench(db: str, schema, runs: int, messages: int, quiet: bool) -> float:
    from we0nb import SqlPersistence

    p = SqlPersistence(db, schema=schema)
    agent = fork_agent(p)
    ids = await _built(agent, messages)
    at = ids[len(ids) // 2]
    made = [await agent.fork(SID, at=at)]  # (warm-up: statements compiled, caches filled)
    times, cpus = [], []
    for _ in range(runs):
        c, t = time.process_time(), time.perf_counter()
        made.append(await agent.fork(SID, at=at))
        times.append((time.perf_counter() - t) * 1000)
        cpus.append((time.process_time() - c) * 1000)
    _drop(p, made)
    await p.close()
    if not quiet:
        print(f"fork {p.dialect:10s} {len(ids)} messages at the middle: {spread(times, 1, 6, ' ms')}  (bar: 50 ms); "
              f"this process's CPU median {statistics.median(cpus):.1f} ms")
    return statistics.median(times), statistics.median(cpus)


def _drop(p, sessions: list[str]) -> None:
    """Delete the forks made (not timed): every round starts from a database of the same size."""
    from sqlalchemy import bindparam, text

    with p.sync_engine().begin() as conn:
        for table, column in (("we0_parts", "session_id"), ("we0_messages", "session_id"), ("we0_sessions", "id")):
            conn.execute(text(f"DELETE FROM {table} WHERE {column} IN :ids").bindparams(
                bindparam("ids", expanding=True)), {"ids": sessions})


def compare(a: argparse.Namespace) -> None:
    """Interleaved rounds: TREE's code, then this tree's, each in a process of its own."""
    sides = {"other": os.path.abspath(a.compare), "this": ROOT}
    got: dict[str, list[float]] = {k: [] for k in sides}
    cpu: dict[str, list[float]] = {k: [] for k in sides}
    base = [sys.executable, os.path.abspath(__file__), "--db", a.db, "--runs", str(a.runs), "--messages",
            str(a.messages), "--quiet"] + (["--schema", a.schema] if a.schema else [])
    for r in range(a.rounds):
        line = []
        for name, tree in sides.items():
            env = {**os.environ, "PYTHONPATH": tree}
            out = subprocess.run(base, env=env, capture_output=True, text=True, check=True).stdout
            wall, used = out.split()[-2:]
            got[name].append(float(wall))
            cpu[name].append(float(used))
            line.append(f"{name} {got[name][-1]:6.1f} ms (CPU {cpu[name][-1]:5.1f})")
        print(f"round {r + 1}: " + "  ".join(line))
    print("median of the rounds' medians: " + "  ".join(
        f"{k} {statistics.median(v):.1f} ms (CPU {statistics.median(cpu[k]):.1f})" for k, v in got.items()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", default="sqlite:////tmp/w11_fork.db")
    ap.add_argument("--schema", default=None)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--messages", type=int, default=1000)
    ap.add_argument("--compare", default=None)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args()
    if a.compare:
        compare(a)
        return
    wall, cpu = asyncio.run(bench(a.db, a.schema, a.runs, a.messages, a.quiet))
    if a.quiet:
        print(f"{wall:.3f} {cpu:.3f}")


if __name__ == "__main__":
    main()
