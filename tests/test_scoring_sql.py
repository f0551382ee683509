"""Scores on SQL: across processes, after a schema upgrade, and as frames of 10,000 items."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from we0nb import SqlPersistence, experiments_df, scores_df
from we0nb.persistence.batches import ItemEnd, NewItem
from we0nb.persistence.scores import ScoreRecord
from we0nb.persistence.sql import tables as S

HERE = Path(__file__).parent


def _worker(url: str, items: int) -> dict:
    out = subprocess.run([sys.executable, str(HERE / "score_worker.py"), "--url", url, "--items", str(items)],
                         capture_output=True, text=True, timeout=300, cwd=HERE.parent,
                         env={**__import__("os").environ, "PYTHONPATH": str(HERE.parent)})
    assert out.returncode == 0, out.stderr[-2000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def test_scores_written_by_one_process_are_skipped_by_the_next(tmp_path):
    url = f"sqlite:///{tmp_path / 'scores.db'}"
    first = _worker(url, 5)
    assert first == {"scored": 10, "skipped": 0, "judged": 5}
    second = _worker(url, 5)
    assert second == {"scored": 0, "skipped": 10, "judged": 0}  # no verdict asked again
    df = scores_df(url, batch="shared")
    assert len(df) == 10 and df["passed"].all()


def test_a_database_of_the_previous_schema_gains_the_scores_table(tmp_path):
    db = tmp_path / "v6.db"

    async def make() -> None:
        p = SqlPersistence(f"sqlite:///{db}")
        await p.list_sessions()
        await p.close()

    asyncio.run(make())
    conn = sqlite3.connect(db)
    conn.execute("DROP TABLE we0_scores")
    conn.execute("UPDATE we0_meta SET value = '7' WHERE key = 'schema_version'")  # (8 made the table)
    conn.commit()
    conn.close()

    async def again() -> list:
        p = SqlPersistence(f"sqlite:///{db}")
        try:
            await p.write_scores([ScoreRecord("b", 0, "s", "ses", 1.0, True)])
            return await p.read_scores("b")
        finally:
            await p.close()

    assert [r.value for r in asyncio.run(again())] == [1.0]
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT value FROM we0_meta WHERE key = 'schema_version'").fetchone() == (
        str(S.SCHEMA_VERSION),)
    conn.close()


SQL_STORES = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def test_frames_of_10000_scored_items_come_from_sql(sql):
    n = 10_000

    async def seed() -> None:
        p = sql.fresh()
        for name, shift in (("big_a", 0.0), ("big_b", 0.25)):
            await p.open_batch(name, [NewItem(json.dumps([f"p{i}"]), f"ses_{name}_{i}") for i in range(n)],
                               session_ids_given=True, now=1.0)
            claimed = await p.claim_batch_items(name, "h:1:w", n, now=2.0, expires=1e12)
            for it in claimed:
                await p.end_batch_item(name, it.item, "h:1:w", ItemEnd("stop", finished=3.0, run_time=0.5,
                                                                          attempts=1, started=2.0))
            await p.write_scores([ScoreRecord(name, i, "exact", f"ses_{name}_{i}", float((i % 4 == 0) ^ (shift > 0)),
                                              (i % 4 == 0) ^ (shift > 0)) for i in range(n)]
                                 + [ScoreRecord(name, i, "close", f"ses_{name}_{i}", (i % 10) / 10 + shift / 10)
                                    for i in range(n)])

    asyncio.run(seed())
    t = time.perf_counter()
    df = scores_df(sql.fresh(), batch="big_a")
    took = time.perf_counter() - t
    assert len(df) == 2 * n and df["item"].is_monotonic_increasing
    exp = experiments_df(sql.fresh(), ["big_a", "big_b"]).set_index(["batch", "scorer"])
    assert exp.loc[("big_a", "exact"), "n"] == n and exp.loc[("big_a", "exact"), "mean"] == 0.25
    assert exp.loc[("big_b", "exact"), "mean"] == 0.75
    lo, hi = exp.loc[("big_a", "exact"), ["ci_low", "ci_high"]]
    assert lo < 0.25 < hi and hi - lo < 0.03
    assert exp.loc[("big_a", "exact"), "duration"].total_seconds() == pytest.approx(0.5 * n)
    print(f"scores_df of {2 * n} scores: {took * 1000:.0f} ms")
