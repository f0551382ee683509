"""W7 of shared/BENCH.md: a batch of 2,000 prompts, concurrency 100, ideal 4 s (3 processes: 1.33 s).

Each item: a fake model that sleeps 50 ms per call and calls one trivial tool in each of
3 steps, then answers (4 model calls). Printed per variant: wall time, ratio to the ideal
(items / concurrency × 4 × 50 ms), CPU ms per item, and the per-step engine overhead —
the time between one model call's end and the next one's start within an item (the tool,
the commits, and any wait for the event loop), p50 / p99. Variants:

* ``bare``: asyncio + ``Semaphore(100)`` sleeping the same 4 × 50 ms (the limit);
* ``memory``, ``sqlite``, ``postgres``: ``agent.batch`` on that store (postgres needs
  ``WE0NB_TEST_POSTGRES_URL`` or ``--pg URL``); ``sqlite-writer``: SQLite's writer process, for
  the code before its removal (``SqlPersistence(writer_process=True)``; its CPU is the ``+child``
  column; run with ``PYTHONPATH`` on an older checkout);
* ``memory-invoke``, ``sqlite-invoke``, ``postgres-invoke``: the same items as plain
  ``agent.invoke`` calls under a Semaphore (the engine alone: what the batch adds is the difference);
* ``postgres-3proc``: 3 processes calling ``agent.batch(prompts, name=same)`` on one
  PostgreSQL schema (each with concurrency 100): wall from the first start to the last end;
* ``pydantic-evals``: ``Dataset.evaluate(task, max_concurrency=100)`` of a pydantic-ai agent
  on a ``FunctionModel`` with the same sleep and tool, when pydantic-evals is installed.

Each variant's ratio is to its own ideal: ``postgres-3proc`` runs 3 × ``concurrency`` items at
once, so its ideal is a third of one process's (1.33 s for the defaults). Before the timed
runs, one warm-up batch per variant (``--warmup``, 200 items) loads the imports, compiles the
statements and opens the databases, so the first timed run is not paying for them.

``--trees OLD,NEW`` compares checkouts: each variant runs under each tree's ``PYTHONPATH`` in
a process of its own (its own warm-up first), the trees interleaved within every round, and
each tree's figures are printed under its name — the before/after of a change, measured in
the same run.

Usage: python bench/w7_batch.py [--items 2000] [--concurrency 100] [--runs 5] [--only memory,sqlite]
                                [--trees /path/before,/path/after]
Nothing is asserted; run variants interleaved (``--runs``) on a busy machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any, Optional

SLEEP = 0.05
CALLS = 4
#: processes sharing one batch in ``postgres-3proc``
PROCS = 3


# --------------------------------------------------------------------------- the workload


class Timeline:
    """Model-call times per item: the gaps between calls are the engine's overhead per step."""

    def __init__(self) -> None:
        self.calls: dict[str, list[tuple[float, float]]] = {}

    def gaps_ms(self) -> list[float]:
        out = []
        for spans in self.calls.values():
            for (_, end), (start, _) in zip(spans, spans[1:]):
                out.append((start - end) * 1000)
        return out


def we0_agent(persistence: Any, timeline: Timeline) -> Any:
    from we0nb import FunctionModel, We0Agent, text, tool, tool_call
    from we0nb.models.base import ToolResult, UserTurn

    @tool(side_effects=False)
    async def lookup(n: int) -> str:
        """A trivial tool."""
        return "ok"

    async def reply(request: Any) -> list:
        key = next(m.text for m in request.messages if isinstance(m, UserTurn))
        t0 = time.perf_counter()
        await asyncio.sleep(SLEEP)
        timeline.calls.setdefault(key, []).append((t0, time.perf_counter()))
        n = sum(1 for m in request.messages if isinstance(m, ToolResult))
        return [tool_call("lookup", {"n": n})] if n < CALLS - 1 else [text("done")]

    # keep_requests=False: like a real model (and pydantic-ai's FunctionModel), it keeps no request
    return We0Agent(FunctionModel(reply, keep_requests=False), tools=[lookup], persistence=persistence)


def prompts(n: int) -> list[str]:
    return [f"prompt {i}" for i in range(n)]


# --------------------------------------------------------------------------- variants


async def run_bare(n: int, conc: int) -> dict[str, Any]:
    sem = asyncio.Semaphore(conc)
    timeline = Timeline()

    async def one(i: int) -> None:
        async with sem:
            spans = timeline.calls.setdefault(str(i), [])
            for _ in range(CALLS):
                t0 = time.perf_counter()
                await asyncio.sleep(SLEEP)
                spans.append((t0, time.perf_counter()))

    t0, c0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*(one(i) for i in range(n)))
    return _figures(time.perf_counter() - t0, time.process_time() - c0, n, timeline)


async def run_we0(store: Any, n: int, conc: int, name: Optional[str] = None) -> dict[str, Any]:
    timeline = Timeline()
    agent = we0_agent(store, timeline)
    t0, c0, k0 = time.perf_counter(), time.process_time(), _children_cpu()
    batch = await agent.batch(prompts(n), name=name, concurrency=conc, progress=False)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert batch.counts == {"stop": n}, batch.counts
    await store.close()
    return dict(_figures(wall, cpu, n, timeline), child_ms_item=(_children_cpu() - k0) / n * 1000)


def _children_cpu() -> float:
    """CPU seconds of the ended child processes (SQLite's writer process, reaped at the batch's end)."""
    t = os.times()
    return t.children_user + t.children_system


async def run_invoke(store: Any, n: int, conc: int) -> dict[str, Any]:
    """The same items as plain ``agent.invoke`` calls under a Semaphore: the engine without the batch."""
    from we0nb import user_message

    timeline = Timeline()
    agent = we0_agent(store, timeline)
    sem = asyncio.Semaphore(conc)

    async def one(p: str) -> None:
        async with sem:
            await agent.invoke(messages=[user_message(p)])

    t0, c0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*(one(p) for p in prompts(n)))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    await store.close()
    return _figures(wall, cpu, n, timeline)


def _figures(wall: float, cpu: float, n: int, timeline: Timeline) -> dict[str, Any]:
    gaps = sorted(timeline.gaps_ms())
    p = (lambda q: gaps[min(len(gaps) - 1, int(q * len(gaps)))]) if gaps else (lambda q: float("nan"))
    return {"wall": wall, "cpu_ms_item": cpu / n * 1000, "p50": p(0.50), "p99": p(0.99)}


def make_store(kind: str, tmp: str, pg: Optional[str]) -> Any:
    from we0nb import MemoryPersistence, SqlPersistence

    if kind == "memory":
        return MemoryPersistence()
    if kind == "sqlite":
        return SqlPersistence(f"sqlite:///{tmp}/w7-{uuid.uuid4().hex[:8]}.db")
    if kind == "sqlite-writer":  # (the code before its removal: PYTHONPATH=<an older checkout>)
        return SqlPersistence(f"sqlite:///{tmp}/w7-{uuid.uuid4().hex[:8]}.db", writer_process=True)
    return SqlPersistence(pg, schema=_pg_schema(pg), engine_options=json.loads(os.environ.get("W7_PG_ENGINE", "{}")))


def _pg_schema(pg: str) -> str:
    import psycopg

    name = f"w7_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
    return name


def _drop_pg_schemas(pg: str) -> None:
    import psycopg

    with psycopg.connect(pg.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as conn:
        for (name,) in conn.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'w7\\_%'").fetchall():
            conn.execute(f'DROP SCHEMA "{name}" CASCADE')


def run_processes(n: int, conc: int, pg: str, procs: int = 3) -> dict[str, Any]:
    """``procs`` processes on one batch; each prints its start/end wall clock and CPU."""
    schema = _pg_schema(pg)
    name = f"w7-shared-{uuid.uuid4().hex[:6]}"
    args = [sys.executable, __file__, "--child", "--items", str(n), "--concurrency", str(conc), "--pg", pg,
            "--schema", schema, "--name", name]
    children = [subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                for _ in range(procs)]
    for c in children:  # wait until each is imported and connected, then start them together
        assert c.stdout is not None and c.stdout.readline().strip() == "READY"
    for c in children:
        assert c.stdin is not None
        c.stdin.write("GO\n")
        c.stdin.flush()
    outs = [json.loads(c.communicate()[0].strip().splitlines()[-1]) for c in children]
    wall = max(o["end"] for o in outs) - min(o["start"] for o in outs)
    cpu = sum(o["cpu"] for o in outs)
    gaps = sorted(g for o in outs for g in o["gaps"])
    p = (lambda q: gaps[min(len(gaps) - 1, int(q * len(gaps)))]) if gaps else (lambda q: float("nan"))
    return {"wall": wall, "cpu_ms_item": cpu / n * 1000, "p50": p(0.5), "p99": p(0.99),
            "items_per_proc": [o["mine"] for o in outs]}


def child(a: argparse.Namespace) -> None:
    from we0nb import SqlPersistence

    async def go() -> dict[str, Any]:
        store = SqlPersistence(a.pg, schema=a.schema)
        timeline = Timeline()
        agent = we0_agent(store, timeline)
        await store.list_sessions()  # connected, schema ready
        print("READY", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        start, c0 = time.time(), time.process_time()
        batch = await agent.batch(prompts(a.items), name=a.name, concurrency=a.concurrency, progress=False)
        end, cpu = time.time(), time.process_time() - c0
        assert batch.counts == {"stop": a.items}, batch.counts
        await store.close()
        return {"start": start, "end": end, "cpu": cpu, "gaps": timeline.gaps_ms(), "mine": len(timeline.calls)}

    print(json.dumps(asyncio.run(go())), flush=True)


async def run_pydantic_evals(n: int, conc: int) -> Optional[dict[str, Any]]:
    try:
        from pydantic_ai import Agent
        from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
        from pydantic_ai.models.function import AgentInfo, FunctionModel
        from pydantic_evals import Case, Dataset
    except ImportError:
        return None
    timeline = Timeline()

    async def model(messages: list, info: AgentInfo) -> ModelResponse:
        key = messages[0].parts[-1].content
        t0 = time.perf_counter()
        await asyncio.sleep(SLEEP)
        timeline.calls.setdefault(key, []).append((t0, time.perf_counter()))
        seen = sum(1 for m in messages for p in m.parts if isinstance(p, ToolReturnPart))
        if seen < CALLS - 1:
            return ModelResponse(parts=[ToolCallPart("lookup", {"n": seen})])
        return ModelResponse(parts=[TextPart("done")])

    agent = Agent(FunctionModel(model))

    @agent.tool_plain
    async def lookup(n: int) -> str:
        return "ok"

    async def task(prompt: str) -> str:
        return (await agent.run(prompt)).output

    dataset = Dataset(name="w7", cases=[Case(name=p, inputs=p) for p in prompts(n)])
    t0, c0 = time.perf_counter(), time.process_time()
    await dataset.evaluate(task, max_concurrency=conc, progress=False)
    return _figures(time.perf_counter() - t0, time.process_time() - c0, n, timeline)


# --------------------------------------------------------------------------- main


def run_variant(v: str, n: int, conc: int, tmp: str, pg: Optional[str]) -> Optional[dict[str, Any]]:
    """One run of variant ``v`` on ``n`` items (None: pydantic-evals is not installed)."""
    if v == "bare":
        return asyncio.run(run_bare(n, conc))
    if v in ("memory", "sqlite", "sqlite-writer", "postgres"):
        return asyncio.run(run_we0(make_store(v, tmp, pg), n, conc))
    if v.endswith("-invoke"):
        return asyncio.run(run_invoke(make_store(v[:-7], tmp, pg), n, conc))
    if v == "postgres-3proc":
        assert pg is not None
        return run_processes(n, conc, pg, PROCS)
    if v == "pydantic-evals":
        return asyncio.run(run_pydantic_evals(n, conc))
    raise SystemExit(f"unknown variant {v!r}")


def ideal_of(v: str, n: int, conc: int) -> float:
    """The variant's own ideal: items / concurrency × the calls' sleep (``PROCS`` × the
    concurrency for the processes sharing one batch)."""
    slots = conc * (PROCS if v.endswith("3proc") else 1)
    return n / slots * CALLS * SLEEP


def run_in_tree(tree: str, v: str, a: argparse.Namespace) -> Optional[dict[str, Any]]:
    """One run of variant ``v`` (after its warm-up) in a process of its own on checkout ``tree``."""
    args = [sys.executable, __file__, "--one", v, "--items", str(a.items), "--concurrency", str(a.concurrency),
            "--warmup", str(a.warmup)] + (["--pg", a.pg] if a.pg else [])
    env = dict(os.environ, PYTHONPATH=tree)
    out = subprocess.run(args, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{v} on {tree} failed:\n{out.stderr[-2000:]}")
    last = out.stdout.strip().splitlines()[-1]
    return None if last == "null" else json.loads(last)


def one(a: argparse.Namespace) -> None:
    """``--one VARIANT``: its warm-up, then one timed run, printed as JSON (for ``--trees``)."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            if a.warmup and run_variant(a.one, a.warmup, a.concurrency, tmp, a.pg) is None:
                print("null")
                return
            print(json.dumps(run_variant(a.one, a.items, a.concurrency, tmp, a.pg)))
        finally:
            if a.pg and a.one.startswith("postgres"):
                _drop_pg_schemas(a.pg)


def run_trees(variants: list[str], trees: list[str], a: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    """``a.runs`` rounds; in each, every variant on every tree (interleaved); keys ``variant@tree``."""
    results: dict[str, list[dict[str, Any]]] = {f"{v}@{t}": [] for v in variants for t in trees}
    for r in range(a.runs):
        for v in variants:
            for t in (trees if r % 2 == 0 else trees[::-1]):  # (alternate which tree goes first)
                got = run_in_tree(t, v, a)
                if got is not None:
                    results[f"{v}@{t}"].append(got)
    return {k: rs for k, rs in results.items() if rs}


def run_all(variants: list[str], a: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    """A warm-up batch per variant, then ``a.runs`` rounds, the variants interleaved in each."""
    results: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            if a.warmup:
                for v in list(variants):
                    if run_variant(v, a.warmup, a.concurrency, tmp, a.pg) is None:
                        print(f"{v} is not installed: skipped (pip install pydantic-evals)")
                        variants.remove(v)
                        results.pop(v)
            for _ in range(a.runs):
                for v in variants:
                    r = run_variant(v, a.items, a.concurrency, tmp, a.pg)
                    if r is not None:
                        results[v].append(r)
        finally:
            if a.pg and any(v.startswith("postgres") for v in variants):
                _drop_pg_schemas(a.pg)
    return {v: rs for v, rs in results.items() if rs}


def report(results: dict[str, list[dict[str, Any]]], n: int, conc: int) -> None:
    width = max([16] + [len(v) for v in results])
    print(f"{'variant':{width}} {'wall s':>7} {'ideal':>6} {'ratio':>6} {'(min-max)':>12} {'CPU ms/item':>12} "
          f"{'+child':>7} {'step p50 ms':>12} {'p99 ms':>8}   (median of runs)")
    for v, rs in results.items():
        med = lambda k: statistics.median(r[k] for r in rs)  # noqa: E731
        ideal = ideal_of(v.split("@")[0], n, conc)
        walls = ", ".join(f"{r['wall']:.2f}" for r in rs)
        span = f"{min(r['wall'] for r in rs) / ideal:.2f}-{max(r['wall'] for r in rs) / ideal:.2f}x"
        extra = f"  items/process {rs[-1]['items_per_proc']}" if "items_per_proc" in rs[-1] else ""
        kid = statistics.median(r.get("child_ms_item", 0.0) for r in rs)
        print(f"{v:{width}} {med('wall'):7.2f} {ideal:6.2f} {med('wall') / ideal:5.2f}x {span:>12} "
              f"{med('cpu_ms_item'):12.2f} {kid:7.2f} {med('p50'):12.2f} {med('p99'):8.2f}   walls: {walls}{extra}")
    for v in [v for v in results if v.split("@")[0] == "postgres-3proc"]:
        one_proc = v.replace("postgres-3proc", "postgres", 1)
        if one_proc in results:
            three, single = (statistics.median(r["wall"] for r in results[k]) for k in (v, one_proc))
            print(f"{v}: {three:.2f} s for the batch vs {single:.2f} s in one process: "
                  f"{'faster' if three < single else 'NOT faster'} ({single / three:.2f}x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=100)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=200, help="items of the warm-up batch per variant (0: none)")
    ap.add_argument("--only", default="bare,memory,sqlite,postgres,postgres-3proc,pydantic-evals")
    ap.add_argument("--pg", default=os.environ.get("WE0NB_TEST_POSTGRES_URL"))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--schema", help=argparse.SUPPRESS)
    ap.add_argument("--name", help=argparse.SUPPRESS)
    ap.add_argument("--trees", help="comma-separated checkouts to compare, each on its own PYTHONPATH, interleaved")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a)
    if a.one:
        return one(a)
    variants = [v for v in a.only.split(",") if v]
    if not a.pg:
        variants = [v for v in variants if not v.startswith("postgres")]
    trees = [os.path.abspath(t) for t in a.trees.split(",")] if a.trees else []
    print(f"W7: {a.items} items x {CALLS} calls of {SLEEP * 1000:.0f} ms, concurrency {a.concurrency}, ideal "
          f"{ideal_of('', a.items, a.concurrency):.2f} s ({PROCS} processes: "
          f"{ideal_of('3proc', a.items, a.concurrency):.2f} s); warm-up {a.warmup} items, {a.runs} runs, interleaved"
          + (f"; trees {', '.join(trees)}" if trees else ""))
    report(run_trees(variants, trees, a) if trees else run_all(variants, a), a.items, a.concurrency)


if __name__ == "__main__":
    main()
