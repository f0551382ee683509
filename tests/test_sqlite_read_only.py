"""A SQLite database on read-only storage can still be read: the frames, the store's reads and the
reading commands (issue 32, item 7).

A WAL database needs its ``-shm`` file even to be read, and on read-only storage SQLite cannot
make it: before, ``we0nb sessions``/``show``/``approvals`` and the frames failed with "unable to open
database file". Now such a file is read with ``immutable=1``, and a warning says so (and that a
leftover WAL file's changes are not read). The storage is a small tmpfs remounted read-only (root
only: the tests skip elsewhere; a chmod would not stop root).
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from we0nb import PersistenceError, SqlPersistence, We0Agent, sessions_df, text, user_message
from we0nb.models import ScriptedModel

NOTE = "reading it with immutable=1"


@pytest.fixture
def storage(tmp_path: Path) -> Iterator[Any]:
    """A tmpfs folder and a function that makes it read-only; unmounted afterwards."""
    where = tmp_path / "ro"
    where.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(where)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")

    def read_only() -> None:
        subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)

    try:
        yield where, read_only
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


async def _write(db: Path, *titles: str) -> list[str]:
    store = SqlPersistence(f"sqlite:///{db}")
    ids = []
    for title in titles:
        agent = We0Agent(ScriptedModel([[text(f"answer {title}")]]), persistence=store)
        result = await agent.invoke(mode="prompt", messages=[user_message(title)])
        ids.append(result.session_id)
    await store.close()  # (checkpoints and removes the WAL)
    return ids


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "we0nb", *args], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=os.getcwd()))


async def test_a_wal_database_on_read_only_storage_is_read_and_says_how(storage: Any,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    where, read_only = storage
    db = where / "we0.db"
    (sid,) = await _write(db, "hello")
    with open(db, "rb") as f:
        assert f.read(20)[18:20] == b"\x02\x02"  # the file is in WAL mode (its header's versions)
    assert not Path(str(db) + "-shm").exists()
    read_only()
    caplog.set_level(logging.WARNING, logger="we0nb")

    store = SqlPersistence(f"sqlite:///{db}")
    frame = sessions_df(store)
    assert len(frame) == 1 and sid in frame.reset_index().astype(str).to_string()
    tr = await store.load_transcript(sid)
    assert [m.info.role for m in tr.messages] == ["user", "assistant"]
    assert NOTE in caplog.text
    with pytest.raises(PersistenceError) as caught:  # a write: one clear line
        await We0Agent(ScriptedModel([[text("x")]]), persistence=store).invoke(
            mode="prompt", session_id=sid, messages=[user_message("more")])
    assert "read-only" in str(caught.value) and "\n" not in str(caught.value)
    await store.close()

    url = f"sqlite:///{db}"
    for args in (("sessions",), ("show", sid), ("approvals",), ("batch", "ls")):
        done = _cli(*args, "--db", url)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        assert NOTE in done.stderr and "Traceback" not in done.stderr
    assert sid in _cli("sessions", "--db", url).stdout
    assert "answer hello" in _cli("show", sid, "--db", url).stdout


async def test_a_leftover_wal_on_read_only_storage_is_said_to_be_unread(storage: Any, tmp_path: Path,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    where, read_only = storage
    src = tmp_path / "src.db"
    (first,) = await _write(src, "first")
    conn = sqlite3.connect(src)  # a process that wrote and did not close: its changes are in the WAL only
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    conn.execute("UPDATE we0_sessions SET title = 'changed'")
    conn.commit()
    shutil.copy(src, where / "we0.db")
    shutil.copy(str(src) + "-wal", str(where / "we0.db") + "-wal")
    conn.close()
    read_only()
    caplog.set_level(logging.WARNING, logger="we0nb")
    store = SqlPersistence(f"sqlite:///{where / 'we0.db'}")
    sessions = await store.list_sessions()
    assert [s.id for s in sessions] == [first]
    assert NOTE in caplog.text and "holds changes that are not read" in caplog.text
    await store.close()
