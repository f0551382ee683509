"""SQLite's WAL stays bounded during a batch, its checkpoints never block the loop, and a full disk
is a clear PersistenceError after which freeing space lets the batch go on (issue 32, item 2).

The bound: at every moment of a batch the WAL is at most 4× the database + 8 MiB. A thread samples
the two file sizes every few milliseconds while the batch runs (a thread: the sampling itself must
not block the event loop, which this module's blocking guard checks).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from batchkit import Ledger, make_agent
from we0nb import PersistenceError, SqlPersistence

MiB = 1024 * 1024


class Sizes:
    """The largest WAL seen, and the database's size then, sampled on a thread."""

    def __init__(self, db: Path):
        self.db, self.wal = db, Path(str(db) + "-wal")
        self.worst = (0, 0)  # (wal, db) where wal - bound(db) was largest
        self.over = 0  # the largest excess over the bound (0: never over it)
        self.max_wal = 0
        self.samples = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                wal, db = self.wal.stat().st_size, self.db.stat().st_size
            except OSError:
                wal, db = 0, 0
            self.samples += 1
            self.max_wal = max(self.max_wal, wal)
            excess = wal - (4 * db + 8 * MiB)
            if excess > self.over or wal >= self.worst[0]:
                self.worst = (wal, db) if wal >= self.worst[0] else self.worst
                self.over = max(self.over, excess)
            self.stop.wait(0.002)

    def __enter__(self) -> "Sizes":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.thread.join()


@pytest.mark.parametrize("items,concurrency", [(300, 1), (300, 8), (1000, 8)])
async def test_the_wal_stays_within_four_times_the_database_plus_8_mib(tmp_path: Path, items: int,
                                                                        concurrency: int) -> None:
    db = tmp_path / "we0.db"
    store = SqlPersistence(f"sqlite:///{db}")
    agent = make_agent(store, Ledger(tmp_path / "ledger.jsonl"), steps=3)
    with Sizes(db) as sizes:
        result = await agent.batch([f"p{i} " + "x" * 2000 for i in range(items)], name="wal",
                                   concurrency=concurrency, progress=False)
    await store.close()
    assert result.counts == {"stop": items}
    wal, at_db = sizes.worst
    print(f"\nWAL at most {sizes.max_wal / MiB:.2f} MiB (database then {at_db / MiB:.2f} MiB, "
          f"finally {db.stat().st_size / MiB:.2f} MiB); {sizes.samples} samples")
    assert sizes.samples > 50
    assert sizes.over <= 0, f"the WAL reached {wal / MiB:.2f} MiB beside a {at_db / MiB:.2f} MiB database"


@pytest.fixture
def small_disk(tmp_path: Path) -> Any:
    """An 8 MiB tmpfs (this needs root: the test skips without it), unmounted afterwards."""
    where = tmp_path / "disk"
    where.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(where)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


async def test_a_full_disk_stops_the_batch_clearly_and_freeing_space_lets_it_finish(small_disk: Path,
                                                                                     tmp_path: Path) -> None:
    db = small_disk / "we0.db"
    filler = small_disk / "filler"
    store = SqlPersistence(f"sqlite:///{db}")
    ledger = Ledger(tmp_path / "ledger.jsonl")
    agent = make_agent(store, ledger, steps=3)
    prompts = [f"p{i} " + "x" * 4000 for i in range(60)]
    await store.list_sessions()  # (the schema first, then the disk is filled but for ~600 KiB)
    with open(filler, "wb") as f:
        free = shutil.disk_usage(small_disk).free
        f.write(b"\0" * max(0, free - 600 * 1024))
    with pytest.raises(PersistenceError) as caught:
        await agent.batch(prompts, name="full", concurrency=4, progress=False)
    message = str(caught.value)
    print("\n" + message)
    assert "full" in message and "Free some space" in message and "\n" not in message
    filler.unlink()
    result = await agent.batch(prompts, name="full", concurrency=4, progress=False)
    assert result.counts == {"stop": 60}
    wal = Path(str(db) + "-wal")
    assert not wal.exists() or wal.stat().st_size <= 4 * db.stat().st_size + 8 * MiB
    await store.close()


async def test_writes_give_way_to_a_checkpoint_the_disks_room_needs(tmp_path: Path) -> None:
    """On a nearly full disk the loop's writes wait while the checkpoint runs: a loop that writes
    without a pause would starve it (SQLite's busy handler sleeps between its tries) until the WAL
    filled the disk, after which no checkpoint can run (the 8 MiB case above failed ~1 run in 20)."""
    import asyncio
    import time

    from we0nb import Session
    from we0nb.persistence.sql.inline import InlineSqlite

    store = SqlPersistence(f"sqlite:///{tmp_path / 'we0.db'}")
    await store.list_sessions()
    db = store._db
    assert isinstance(db, InlineSqlite)
    hold = threading.Event()
    db.ckpt_thread = threading.Thread(target=hold.wait, daemon=True)  # (a checkpoint under way)
    db.ckpt_thread.start()
    db.ckpt_urgent = True
    t = time.time()
    write = asyncio.ensure_future(store.upsert_session(Session(id="s", time={"created": t, "updated": t})))
    await asyncio.sleep(0.1)
    assert not write.done()  # (it waits for the checkpoint)
    db.ckpt_urgent = False  # (the checkpoint ended)
    await asyncio.wait_for(write, 5)
    assert (await store.get_session("s")) is not None
    hold.set()
    db.ckpt_thread.join()
    db.ckpt_thread = None
    await store.close()
