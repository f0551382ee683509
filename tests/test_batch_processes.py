"""Batch runs shared by real processes on one PostgreSQL database (issue 12, scale-out).

Three worker processes call ``agent.batch(prompts, name=same)``; one is killed with SIGKILL
while it runs items. The others take its items over (its PID is gone from this host: at
once), every item ends exactly once, no side effect runs twice (the ledger), and the
frames agree with the store.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from we0nb import SqlPersistence

from batchkit import Ledger
from sql_support import PG_SKIP_REASON, PG_URL, create_schema, drop_schema

pytestmark = [pytest.mark.postgres, pytest.mark.crash]

WORKER = Path(__file__).with_name("batch_worker.py")


@pytest.fixture
def schema():
    if PG_URL is None:
        pytest.skip(PG_SKIP_REASON)
    name = create_schema()
    yield name
    drop_schema(name)


def start(schema: str, ledger: Path, n: int, log: Path) -> subprocess.Popen:
    args = [sys.executable, str(WORKER), "--url", PG_URL, "--schema", schema, "--name", "shared", "--items", str(n),
            "--ledger", str(ledger), "--concurrency", "4"]
    return subprocess.Popen(args, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=dict(os.environ))


def test_three_processes_share_a_batch_and_a_killed_one_loses_nothing(schema, tmp_path) -> None:
    n = 60
    ledger_path = tmp_path / "ledger.jsonl"
    ledger = Ledger(ledger_path)
    logs = [tmp_path / f"w{i}.log" for i in range(3)]
    procs = [start(schema, ledger_path, n, logs[i]) for i in range(3)]
    victim = procs[0]
    deadline = time.monotonic() + 120
    while not any(x["pid"] == victim.pid for x in ledger.lines()):  # it is inside an item's tool call
        assert time.monotonic() < deadline and victim.poll() is None, logs[0].read_text()
        time.sleep(0.01)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    for p in procs[1:]:
        assert p.wait(timeout=240) == 0, "\n".join(log.read_text() for log in logs)
    results = [json.loads(line[7:]) for log in logs[1:] for line in log.read_text().splitlines()
               if line.startswith("RESULT ")]
    assert [r["counts"] for r in results] == [{"stop": n}] * 2  # each returned once every item had ended

    keys = [(x["prompt"], x["n"]) for x in ledger.lines()]
    assert len(keys) == len(set(keys)), "a side effect ran twice"
    assert len({x["pid"] for x in ledger.lines()}) == 3  # all three did work
    asyncio.run(_check_store(schema, n, victim.pid))


async def _check_store(schema: str, n: int, victim_pid: int) -> None:
    from we0nb import batch_df, sessions_df, tool_calls_df

    store = SqlPersistence(PG_URL, schema=schema)
    try:
        items = await store.batch_items("shared")
        assert [it.status for it in items] == ["stop"] * n
        taken_over = [it for it in items if it.attempts > 1]
        assert taken_over, "the killed worker held items that the others resumed"
        for it in items:  # every item ended exactly once: one finished turn, its answer last
            tr = await store.load_transcript(it.session_id)
            answers = [m for m in tr.messages if m.info.role == "assistant" and not m.tool_parts
                       and m.info.error is None]  # (a step cut by the kill is closed with an error)
            assert len(answers) == 1 and answers[0] is tr.messages[-1] and it.text == answers[0].text
            assert not tr.needs_resume
            assert it.tool_calls == sum(len(m.tool_parts) for m in tr.messages)
        df = batch_df(store, "shared")
        calls = tool_calls_df(store)
        per_session = calls.groupby("session_id", observed=True).size()
        assert (df.set_index("session_id")["tool_calls"] == per_session.reindex(df["session_id"]).values).all()
        assert set(sessions_df(store, batch="shared")["session_id"]) == set(df["session_id"])
    finally:
        await store.close()
