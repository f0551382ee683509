"""W5 frames: 10,000 sessions / 1,000,000 parts in SQLite → ``tool_calls_df`` and ``parts_df``.

    python bench/w5_frames.py                 # the full workload (builds $TMPDIR/we0nb_w5.db once)
    python bench/w5_frames.py --sessions 500  # a smaller one
    python bench/w5_frames.py --rebuild       # regenerate the database

The database is made by SqlPersistence (tables, version row), then filled with bulk
``executemany`` inserts of rows built from the schema's column semantics, each with a
valid JSON ``data`` document (the exact pydantic dump of the part or message), not
through the engine. Per session: 4 turns of one user message, 4 tool steps (step start,
text, 2 tool calls, step finish) and a final step (step start, reasoning, text, step
finish) — 24 messages and 100 parts, 32 of them tool calls (5 % failed, 2 % interrupted,
1 % recalled, a few left pending/running by an abort).

Each measurement runs in a fresh subprocess (so its peak RSS, ``ru_maxrss``, is its own):
a warm-up, then ``--runs`` timed runs; min / median / max are printed. The baseline is the
naive build — load every transcript as objects through the persistence port
(``SqlPersistence.load_transcript``), then make the DataFrame — measured in the same run
on a subset of sessions (``--naive-sessions``, default 1,000) and extrapolated linearly to
all sessions (the naive cost is per session: one transcript load each).
Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import statistics
import subprocess
import tempfile
import sys
import time
from pathlib import Path

from _stats import spread

HERE = Path(__file__).resolve().parent
DEFAULT_DB = Path(tempfile.gettempdir()) / "we0nb_w5.db"

TOOLS = ["read_file", "search", "write_file", "run_shell", "fetch_url", "calculator"]
TURNS, TOOL_STEPS, CALLS_PER_STEP = 4, 4, 2
PARTS_PER_SESSION = TURNS * (1 + TOOL_STEPS * (3 + CALLS_PER_STEP) + 4)   # 100
MESSAGES_PER_SESSION = TURNS * (1 + TOOL_STEPS + 1)                       # 24


def _j(obj) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def generate(db: Path, n_sessions: int, seed: int = 5) -> None:
    """Fill a fresh SQLite database with ``n_sessions`` sessions of 100 parts each."""
    from we0nb.persistence.sql import tables as S
    from we0nb.persistence.sql import SqlPersistence

    for suffix in ("", "-wal", "-shm"):
        try:
            os.unlink(str(db) + suffix)
        except FileNotFoundError:
            pass
    engine = SqlPersistence(f"sqlite:///{db}").sync_engine()   # tables + version row
    rnd = random.Random(seed)
    t0 = 1_780_000_000.0
    counter = 0

    def new_id(prefix: str, t: float) -> str:
        nonlocal counter
        counter += 1
        return f"{prefix}_{int(t * 1e6):014x}{counter:010x}"

    def cols(table):  # (model_view, the engine's cold-start cache, stays NULL: frames never read it)
        return [c.name for c in table.columns if c.name != "model_view"]

    raw = engine.raw_connection()
    cur = raw.cursor()
    inserts = [(table, f"INSERT INTO {table.name} ({', '.join(cols(table))}) "
                       f"VALUES ({', '.join('?' * len(cols(table)))})")
               for table in (S.sessions, S.messages, S.parts)]

    def flush():
        for (table, sql), rows in zip(inserts, (s_rows, m_rows, p_rows)):
            cur.executemany(sql, rows)
            rows.clear()

    s_rows, m_rows, p_rows = [], [], []
    for i in range(n_sessions):
        if i and i % 1000 == 0:
            flush()
        sid = f"ses_{i:06d}"
        t = t0 + i * 90.0
        created = t
        for turn in range(TURNS):
            # the user message
            t += rnd.uniform(1, 5)
            mid = new_id("msg", t)
            m_rows.append((mid, sid, "user", t, None, None, None, None, None, None, None, None, None, None, False,
                           _j({"id": mid, "session_id": sid, "role": "user", "time": {"created": t, "completed": None},
                               "error": None})))
            pid = new_id("prt", t)
            txt = f"Question {turn} of session {i}: please look into item #{rnd.randint(1, 999)} — ünïcødé ✓"
            p_rows.append((pid, sid, mid, "text", None, None, None, t, t, False, None, False,
                           _j({"id": pid, "session_id": sid, "message_id": mid, "type": "text", "text": txt,
                               "time": {"start": t, "end": t}, "synthetic": False})))
            parent = mid
            for step in range(TOOL_STEPS + 1):
                final = step == TOOL_STEPS
                t += 0.001
                created_m = t
                mid = new_id("msg", t)
                parts = []
                pid = new_id("prt", t)
                parts.append((pid, sid, mid, "step-start", None, None, None, t, t, False, None, False,
                              _j({"id": pid, "session_id": sid, "message_id": mid, "type": "step-start", "time": t})))
                if final:
                    t += 0.01
                    start = t
                    t += rnd.uniform(0.05, 0.4)
                    pid = new_id("prt", start)
                    parts.append((pid, sid, mid, "reasoning", None, None, None, start, t, False, None, False,
                                   _j({"id": pid, "session_id": sid, "message_id": mid, "type": "reasoning",
                                       "text": "Thinking about the results…", "time": {"start": start, "end": t}})))
                t += 0.01
                start = t
                t += rnd.uniform(0.05, 0.8)
                pid = new_id("prt", start)
                words = " ".join(rnd.choice(("alpha", "beta", "gamma", "δέλτα", "epsilon")) for _ in range(12))
                parts.append((pid, sid, mid, "text", None, None, None, start, t, False, None, False,
                              _j({"id": pid, "session_id": sid, "message_id": mid, "type": "text", "text": words,
                                  "time": {"start": start, "end": t}, "synthetic": False})))
                if not final:
                    for _ in range(CALLS_PER_STEP):
                        t += 0.001
                        pid, call = new_id("prt", t), new_id("call", t)
                        tool = rnd.choice(TOOLS)
                        inp = {"path": f"/data/{rnd.randint(1, 500)}.txt", "limit": rnd.randint(1, 100)}
                        r = rnd.random()
                        start = t
                        t += rnd.lognormvariate(-2.5, 1.0)
                        meta: dict = {}
                        if r < 0.01:
                            meta = {"recalled": True}
                        if r < 0.05:
                            st = {"status": "error", "input": inp, "error": f"OSError: cannot read {inp['path']}",
                                  "metadata": meta, "time": {"start": start, "end": t}}
                        elif r < 0.07:
                            reason = "resume" if r < 0.065 else "blocked"
                            meta = {"interrupted": True, "reason": reason}
                            st = {"status": "error", "input": inp, "error": "Interrupted during recovery.",
                                  "metadata": meta, "time": {"start": None if reason == "blocked" else start, "end": t}}
                        elif r < 0.072:
                            st = {"status": "running", "input": inp, "time": {"start": start, "end": None}}
                        elif r < 0.074:
                            st = {"status": "pending", "input": inp, "raw": None}
                        else:
                            st = {"status": "completed", "input": inp, "output": f"{rnd.randint(0, 10**6)} bytes ok",
                                  "metadata": meta, "time": {"start": start, "end": t}}
                        tm = st.get("time") or {}
                        parts.append((pid, sid, mid, "tool", tool, call, st["status"], tm.get("start"), tm.get("end"),
                                      meta.get("interrupted") is True, meta.get("reason"), meta.get("recalled") is True,
                                      _j({"id": pid, "session_id": sid, "message_id": mid, "type": "tool",
                                          "call_id": call, "tool": tool, "state": st})))
                t += 0.001
                pid = new_id("prt", t)
                inp_t, out_t = rnd.randint(100, 5000), rnd.randint(10, 500)
                reason = "stop" if final else "tool-calls"
                usage = {"input_tokens": inp_t, "output_tokens": out_t, "reasoning_tokens": 0, "cached_tokens": 0}
                parts.append((pid, sid, mid, "step-finish", None, None, None, t, t, False, None, False,
                              _j({"id": pid, "session_id": sid, "message_id": mid, "type": "step-finish",
                                  "reason": reason, "usage": usage, "time": t})))
                p_rows.extend(parts)
                m_rows.append((mid, sid, "assistant", created_m, t, parent, "scripted", reason, None, None,
                               inp_t, out_t, 0, 0, False,
                               _j({"id": mid, "session_id": sid, "role": "assistant",
                                   "time": {"created": created_m, "completed": t}, "error": None,
                                   "parent_id": parent, "model_id": "scripted", "usage": usage,
                                   "finish_reason": reason, "summary": False})))
        title = f"Session {i} ✓"
        s_rows.append((sid, title, created, t, None,
                       _j({"id": sid, "title": title, "time": {"created": created, "updated": t}, "revert": None})))

    try:
        flush()
        raw.commit()
        cur.execute("ANALYZE")
        raw.commit()
    finally:
        raw.close()
    engine.dispose()


# --------------------------------------------------------------------------- measurements (child side)


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _child(what: str, db: str, runs: int, naive_sessions: int) -> dict:
    import pandas as pd  # noqa: F401  (import cost outside the timings)

    from we0nb.notebook import frames
    from we0nb.persistence.sql import SqlPersistence

    sp = SqlPersistence(f"sqlite:///{db}")
    base_rss = _rss_mb()
    times, cpu, shape = [], [], None
    if what in ("tool_calls_df", "parts_df"):
        fn = getattr(frames, what)
        fn(sp, "ses_000000")  # warm-up: engine, schema check, imports
        for _ in range(runs):
            t, c = time.perf_counter(), time.process_time()
            df = fn(sp)
            times.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
            shape = df.shape
            del df
    else:  # naive: transcripts as objects through the port, then the frame
        fn = frames.tool_calls_df if what == "naive_tool_calls" else frames.parts_df
        port = _port_only(sp, [f"ses_{i:06d}" for i in range(naive_sessions)])
        for _ in range(runs):
            t, c = time.perf_counter(), time.process_time()
            df = fn(port)
            times.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
            shape = df.shape
            del df
    return {"what": what, "times": times, "cpu": cpu, "shape": shape, "rss_base_mb": base_rss,
            "rss_peak_mb": _rss_mb()}


def _port_only(p, ids):
    """The persistence seen only through its async port (what a naive build uses): a
    persistence without SQL, so the frames load every transcript as objects.

    ``list_sessions`` returns the measured subset (one ``get_session`` each), so the naive
    cost is per session and extrapolates linearly.
    """
    from we0nb import MemoryPersistence

    class PortOnly(MemoryPersistence):
        async def list_sessions(self):
            return [await p.get_session(i) for i in ids]

        async def load_transcript(self, session_id):
            return await p.load_transcript(session_id)

    return PortOnly()


def _measure(what: str, db: Path, runs: int, naive_sessions: int) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", what, "--db", str(db), "--runs", str(runs),
         "--naive-sessions", str(naive_sessions)],
        check=True, capture_output=True, text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=10_000)
    ap.add_argument("--db", type=Path, default=None)
    ap.add_argument("--rebuild", action="store_true")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--naive-runs", type=int, default=3)
    ap.add_argument("--naive-sessions", type=int, default=1_000)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()

    if a.child:
        print(json.dumps(_child(a.child, str(a.db), a.runs, a.naive_sessions)))
        return

    db = a.db or (DEFAULT_DB if a.sessions == 10_000 else Path(tempfile.gettempdir()) / f"we0nb_w5_{a.sessions}.db")
    import sqlite3

    def counts():
        with sqlite3.connect(db) as c:
            return (c.execute("select count(*) from we0_sessions").fetchone()[0],
                    c.execute("select count(*) from we0_parts").fetchone()[0])

    fresh = a.rebuild or not db.exists()
    if not fresh:
        try:
            fresh = counts()[0] != a.sessions
        except sqlite3.Error:
            fresh = True
    if fresh:
        t = time.perf_counter()
        generate(db, a.sessions)
        print(f"generated {db} in {time.perf_counter() - t:.1f} s")
    n_sessions, n_parts = counts()
    naive_n = min(a.naive_sessions, n_sessions)
    print(f"W5 frames: {n_sessions:,} sessions, {n_parts:,} parts, {db.stat().st_size / 1e6:.0f} MB SQLite; "
          f"{os.cpu_count()} cpus, load average {os.getloadavg()[0]:.1f}; python {sys.version.split()[0]}")

    def fmt(r: dict) -> str:
        return (f"{spread(r['times'], 2, 6, ' s')}  "
                f"(CPU median {statistics.median(r['cpu']):5.2f} s)  peak RSS {r['rss_peak_mb']:5.0f} MB "
                f"(after imports {r['rss_base_mb']:.0f} MB)  rows {r['shape'][0]:,}")

    scale = n_sessions / naive_n
    for view, naive in (("tool_calls_df", "naive_tool_calls"), ("parts_df", "naive_parts")):
        fast = _measure(view, db, a.runs, naive_n)
        slow = _measure(naive, db, a.naive_runs, naive_n)
        fm = statistics.median(fast["times"])
        sm = statistics.median(slow["times"]) * scale
        print(f"{view:14s} SQL   {fmt(fast)}")
        print(f"{'':14s} naive {fmt(slow)}  [{naive_n:,} sessions]")
        print(f"{'':14s} naive extrapolated to {n_sessions:,} sessions: median {sm:.1f} s  → speed-up {sm / fm:.1f}×"
              f"  (target ≤ 5 s and ≥ 10×: {'met' if fm <= 5 and sm / fm >= 10 else 'NOT met'}; "
              f"load average now {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
