"""``we0nb batch run`` / ``batch work``: batch workers from the command line (issue 32, "Many hosts,
one batch"). The agent is named ``MODULE:ATTR``; the workers share the batch through the
database; a SIGTERM gives back what a worker holds; exit 0 only once the batch is complete.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from batchkit import Ledger
from sql_support import PG_SKIP_REASON, PG_URL, _libpq
from we0nb import SqlPersistence

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent

AGENT_MODULE = """\
import os

from batchkit import Ledger, make_agent
from we0nb import MemoryPersistence


def agent():
    # a function returning the agent; its store is replaced by the worker's --db
    failing = os.environ.get("FAIL", "").split(",")
    asking = os.environ.get("APPROVAL", "").split(",")
    return make_agent(MemoryPersistence(), Ledger(os.environ["LEDGER"]), fail=lambda p: p in failing,
                      approval=lambda p: p in asking,
                      delay=float(os.environ.get("DELAY", "0.01")), tool_delay=float(os.environ.get("TOOL_DELAY", "0.02")))


async def async_agent():
    return agent()


the_agent = agent()
"""


def write_inputs(tmp_path: Path, n: int) -> Path:
    (tmp_path / "workagent.py").write_text(AGENT_MODULE)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"p{i}", "other": i}) + "\n" for i in range(n)))
    return prompts


def env_for(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)]), "PYTHONIOENCODING": "utf-8",
           "LEDGER": str(tmp_path / "ledger.jsonl"), **extra}
    env.pop("WE0NB_DB", None)
    return env


def cli(tmp_path: Path, *args: str, timeout: float = 180, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "we0nb.cli", *args], cwd=tmp_path, env=env_for(tmp_path, **extra),
                          capture_output=True, text=True, timeout=timeout)


def one_line(p: subprocess.CompletedProcess) -> str:
    assert p.returncode == 1, (p.returncode, p.stdout, p.stderr)
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("we0nb batch: error: "), p.stderr
    assert "Traceback" not in p.stderr
    return lines[0]


# --------------------------------------------------------------------------- on one SQLite file


def test_batch_run_completes_a_batch_with_a_text_bar_then_work_finds_it_complete(tmp_path) -> None:
    prompts = write_inputs(tmp_path, 6)
    db = f"sqlite:///{tmp_path / 'b.db'}"
    p = cli(tmp_path, "batch", "run", "workagent:agent", "--prompts", str(prompts), "--name", "b", "--db", db,
            "--concurrency", "3")
    assert p.returncode == 0, p.stderr
    assert "batch b: complete, 6 items (stop=6)" in p.stdout
    assert "6/6" in p.stderr and "Traceback" not in p.stderr  # the notebook's bar, as text
    assert len(Ledger(tmp_path / "ledger.jsonl").lines()) == 6 * 2  # act at steps 0 and 2 of each item
    # a worker joining a complete batch has nothing to do: exit 0 at once
    w = cli(tmp_path, "batch", "work", "workagent:the_agent", "b", "--db", db, "--no-progress")
    assert w.returncode == 0 and "complete, 6 items" in w.stdout and w.stderr == "", w.stderr
    # the same run again continues it (same prompts, same name): nothing runs twice
    again = cli(tmp_path, "batch", "run", "workagent:agent", "--prompts", str(prompts), "--name", "b", "--db", db)
    assert again.returncode == 0 and len(Ledger(tmp_path / "ledger.jsonl").lines()) == 12


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_prompts_from_a_table_and_its_column(tmp_path, suffix) -> None:
    import pandas as pd

    write_inputs(tmp_path, 0)
    df = pd.DataFrame({"id": ["1", "2", "3"], "question": ["a?", "b?", "c?"]})
    path = tmp_path / f"q{suffix}"
    df.to_csv(path, index=False) if suffix == ".csv" else df.to_parquet(path)
    db = f"sqlite:///{tmp_path / 't.db'}"
    p = cli(tmp_path, "batch", "run", "workagent:async_agent", "--prompts", str(path), "--column", "question",
            "--name", "t", "--db", db, "--no-progress")
    assert p.returncode == 0 and "complete, 3 items" in p.stdout, p.stderr
    assert sorted({x["prompt"] for x in Ledger(tmp_path / "ledger.jsonl").lines()}) == ["a?", "b?", "c?"]


def test_exit_0_only_once_the_batch_is_complete_failed_items_included(tmp_path) -> None:
    prompts = write_inputs(tmp_path, 4)
    db = f"sqlite:///{tmp_path / 'f.db'}"
    args = ("batch", "run", "workagent:agent", "--prompts", str(prompts), "--name", "f", "--db", db, "--no-progress",
            "--concurrency", "1")
    stopped = cli(tmp_path, *args, "--max-failures", "1", FAIL="p0")
    line = one_line(stopped)  # exit 1: items are left
    assert "batch f: --max-failures reached" in line and "we0nb batch work workagent:agent f" in line
    assert "unfinished" in stopped.stdout
    done = cli(tmp_path, *args, FAIL="p0")  # the same worker without the limit: every item ends
    assert done.returncode == 0, done.stderr
    assert "batch f: complete, 4 items (failed=1, stop=3)" in done.stdout


def test_items_waiting_for_approval_end_the_batch_and_the_last_line_says_so(tmp_path) -> None:
    prompts = write_inputs(tmp_path, 4)
    db = f"sqlite:///{tmp_path / 'a.db'}"
    p = cli(tmp_path, "batch", "run", "workagent:agent", "--prompts", str(prompts), "--name", "a", "--db", db,
            APPROVAL="p1,p3")
    assert p.returncode == 0, p.stderr
    assert "complete, 4 items (approval=2, stop=2)" in p.stdout, p.stdout
    assert f"2 ended waiting for a person's approval: `we0nb approvals --db {db}` lists the calls" in p.stdout
    assert "done=2 approval=2 failed=0" in p.stderr  # (the bar: not counted as done)
    listed = cli(tmp_path, "approvals", "--db", db)
    assert listed.returncode == 0 and listed.stdout.count("act") >= 2, listed


def test_suggested_commands_leave_out_a_db_url_that_came_from_we0nb_db(tmp_path) -> None:
    # pasted, `--db 'postgresql://user:***@…'` would log in with the password "***": the variable applies to it too
    prompts = write_inputs(tmp_path, 2)
    env = {**env_for(tmp_path), "WE0NB_DB": f"sqlite:///{tmp_path / 'env.db'}"}
    p = subprocess.run([sys.executable, "-m", "we0nb.cli", "batch", "run", "workagent:agent", "--prompts", str(prompts),
                        "--name", "v", "--no-progress"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=180)
    assert p.returncode == 0 and "`we0nb batch show v` shows it" in p.stdout, (p.stdout, p.stderr)
    w = subprocess.run([sys.executable, "-m", "we0nb.cli", "batch", "work", "workagent:agent", "nob"], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=180)
    assert w.returncode == 1 and "`we0nb batch run workagent:agent --prompts FILE --name nob`." in w.stderr, w.stderr


def test_clear_one_line_errors(tmp_path) -> None:
    prompts = write_inputs(tmp_path, 2)
    (tmp_path / "notagent.py").write_text("value = 3\ndef broken():\n    raise RuntimeError('no key')\n")
    (tmp_path / "crashes.py").write_text("import json\n1 / 0\n")
    db = f"sqlite:///{tmp_path / 'e.db'}"
    run = ("batch", "run")
    tail = ("--prompts", str(prompts), "--name", "e", "--db", db)
    cases = {
        "is not MODULE:ATTR": (*run, "workagent", *tail),
        "no module 'nosuch'": (*run, "nosuch:agent", *tail),
        "'workagent' has no attribute 'nope'": (*run, "workagent:nope", *tail),
        "notagent:value is an int, not a We0Agent": (*run, "notagent:value", *tail),
        "notagent:broken() failed: RuntimeError: no key": (*run, "notagent:broken", *tail),
        "importing 'crashes' (from crashes:x) failed: ZeroDivisionError": (*run, "crashes:x", *tail),
        "--prompts missing.jsonl: no such file": (*run, "workagent:agent", "--prompts", "missing.jsonl",
                                                  "--name", "e", "--db", db),
        "--column 'q': ": (*run, "workagent:agent", *tail, "--column", "q"),
        "keeps its sessions in memory: pass --db": (*run, "workagent:agent", "--prompts", str(prompts), "--name", "e"),
        "no database at": ("batch", "work", "workagent:agent", "nob", "--db", db),  # (work creates none)
        # a stray space would name a second batch, all of whose items run again
        "--name ' e' starts or ends with a space": (*run, "workagent:agent", "--prompts", str(prompts),
                                                    "--name", " e", "--db", db),
        # an in-memory SQLite database is refused as --db memory is: nothing of it would be left to show
        "--db sqlite://: a batch in memory is not shared": (*run, "workagent:agent", "--prompts", str(prompts),
                                                             "--name", "e", "--db", "sqlite://"),
        "--db sqlite:///:memory:: a batch in memory": (*run, "workagent:agent", "--prompts", str(prompts),
                                                        "--name", "e", "--db", "sqlite:///:memory:"),
    }
    for expected, args in cases.items():
        line = one_line(cli(tmp_path, *args))
        assert expected in line, (expected, line)
    # a wrong file type, and an unreadable table
    (tmp_path / "p.txt").write_text("x\n")
    assert ".jsonl, .csv or .parquet" in one_line(cli(tmp_path, *run, "workagent:agent", "--prompts", "p.txt",
                                                       "--name", "e", "--db", db))
    (tmp_path / "bad.parquet").write_text("not parquet")
    assert "cannot read it as parquet" in one_line(cli(tmp_path, *run, "workagent:agent", "--prompts",
                                                        "bad.parquet", "--name", "e", "--db", db))


async def test_the_signal_that_ended_a_worker_gives_its_exit_code() -> None:
    from we0nb.cli.batch_work import Stopper

    for first, second, code in [(signal.SIGTERM, signal.SIGTERM, 143), (signal.SIGINT, signal.SIGTERM, 143),
                                (signal.SIGTERM, signal.SIGINT, 130), (signal.SIGINT, None, 130)]:
        async def worker() -> Stopper:
            stopper = Stopper(asyncio.Event())
            stopper._on_signal(first)
            if second is not None:
                stopper._on_signal(second)
                stopper._on_signal(second)  # (a third: nothing more to cancel)
            try:
                await asyncio.sleep(0)
            except asyncio.CancelledError:
                asyncio.current_task().uncancel()
            return stopper

        stopper = await asyncio.create_task(worker())
        assert stopper.stop.is_set() and stopper.signal == first and stopper.cancelled_by == second
        assert stopper.exit_code() == code, (first, second)


def worker_inside_a_call(tmp_path: Path, name: str) -> tuple[str, subprocess.Popen, Ledger]:
    """A `batch run` worker on 16 items (4 at a time), once it is inside an item's tool call."""
    prompts = write_inputs(tmp_path, 16)
    db = f"sqlite:///{tmp_path / (name + '.db')}"
    ledger = Ledger(tmp_path / "ledger.jsonl")
    proc = subprocess.Popen([sys.executable, "-m", "we0nb.cli", "batch", "run", "workagent:agent", "--prompts",
                             str(prompts), "--name", name, "--db", db, "--concurrency", "4", "--no-progress"],
                            cwd=tmp_path, env=env_for(tmp_path, DELAY="0.1", TOOL_DELAY="0.3"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not ledger.lines():  # inside an item's tool call
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.01)
    return db, proc, ledger


def test_a_second_sigterm_cancels_at_once_and_still_exits_143(tmp_path) -> None:
    # a scheduler that sends SIGTERM twice: the worker is cancelled at once, and says so — not "Ctrl-C", not 130
    db, proc, _ = worker_inside_a_call(tmp_path, "d")
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.005)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    # (-15: the second signal came once the worker had stopped and let go of its handler — ended
    # by SIGTERM all the same, which a shell or a scheduler reports as 143)
    assert proc.returncode in (143, -signal.SIGTERM), (out, err)
    assert "Traceback" not in err and "Ctrl-C" not in err, err
    assert proc.returncode == -signal.SIGTERM or "by a second SIGTERM" in err or "stopped by SIGTERM" in err, err
    w = cli(tmp_path, "batch", "work", "workagent:agent", "d", "--db", db, "--no-progress")
    assert w.returncode == 0 and "complete, 16 items (stop=16)" in w.stdout, w.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_gives_back_what_the_worker_holds_and_work_finishes_it(tmp_path, sig) -> None:
    db, proc, ledger = worker_inside_a_call(tmp_path, "s")
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == (143 if sig == signal.SIGTERM else 130), (out, err)
    said = "SIGTERM" if sig == signal.SIGTERM else "Ctrl-C"
    assert "Traceback" not in err and f"stopped by {said}: nothing held" in err
    items = asyncio.run(_items(db, "s"))
    assert not [it for it in items if it.status == "running"], "a stopped worker left items held"
    assert any(it.status == "pending" for it in items)
    w = cli(tmp_path, "batch", "work", "workagent:agent", "s", "--db", db, "--no-progress")
    assert w.returncode == 0 and "complete, 16 items (stop=16)" in w.stdout, w.stderr
    keys = [(x["prompt"], x["n"]) for x in ledger.lines()]
    assert len(keys) == len(set(keys)), "a side effect ran twice"


async def _items(url: str, name: str) -> list:
    store = SqlPersistence(url)
    try:
        return await store.batch_items(name)
    finally:
        await store.close()


# --------------------------------------------------------------------------- three workers on PostgreSQL


@pytest.fixture
def pg_database():
    if PG_URL is None:
        pytest.skip(PG_SKIP_REASON)
    import psycopg
    from sqlalchemy.engine import make_url

    name = f"we0cli_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(_libpq(PG_URL), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = make_url(PG_URL).set(database=name).render_as_string(hide_password=False)
    asyncio.run(_create_tables(url))  # (once, before three processes start on it)
    yield url
    with psycopg.connect(_libpq(PG_URL), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def _create_tables(url: str) -> None:
    store = SqlPersistence(url)
    try:
        await store.list_batches()
    finally:
        await store.close()


@pytest.mark.postgres
@pytest.mark.crash
def test_three_cli_workers_one_sigtermed_one_sigkilled_every_item_ends_once(pg_database, tmp_path) -> None:
    n = 45
    prompts = write_inputs(tmp_path, n)
    ledger = Ledger(tmp_path / "ledger.jsonl")
    logs = [tmp_path / f"w{i}.log" for i in range(3)]
    procs = [subprocess.Popen([sys.executable, "-m", "we0nb.cli", "batch", "run", "workagent:agent", "--prompts",
                               str(prompts), "--name", "shared", "--db", pg_database, "--concurrency", "4",
                               "--no-progress"], cwd=tmp_path, env=env_for(tmp_path, TOOL_DELAY="0.1"),
                              stdout=open(log, "w"), stderr=subprocess.STDOUT) for log in logs]
    termed, killed, survivor = procs
    deadline = time.monotonic() + 180
    while not {termed.pid, killed.pid} <= {x["pid"] for x in ledger.lines()}:  # both inside an item's tool call
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), \
            "\n".join(log.read_text() for log in logs)
        time.sleep(0.01)
    killed.send_signal(signal.SIGKILL)
    termed.send_signal(signal.SIGTERM)
    assert termed.wait(timeout=120) == 143, logs[0].read_text()
    killed.wait(timeout=60)
    assert survivor.wait(timeout=300) == 0, logs[2].read_text()
    assert f"batch shared: complete, {n} items (stop={n})" in logs[2].read_text()
    assert "stopped by SIGTERM: nothing held" in logs[0].read_text()
    assert not any("Traceback" in log.read_text() for log in logs)

    keys = [(x["prompt"], x["n"]) for x in ledger.lines()]
    assert len(keys) == len(set(keys)), "a side effect ran twice"
    asyncio.run(_each_item_ended_once(pg_database, n))


async def _each_item_ended_once(url: str, n: int) -> None:
    store = SqlPersistence(url)
    try:
        items = await store.batch_items("shared")
        assert [it.status for it in items] == ["stop"] * n and not any(it.queued for it in items)
        assert any(it.attempts > 1 for it in items), "the stopped and the killed workers' items were taken over"
        for it in items:  # one finished turn per item, its answer last
            tr = await store.load_transcript(it.session_id)
            answers = [m for m in tr.messages if m.info.role == "assistant" and not m.tool_parts
                       and m.info.error is None]
            assert len(answers) == 1 and answers[0] is tr.messages[-1] and it.text == answers[0].text
            assert not tr.needs_resume
    finally:
        await store.close()


def test_a_parquet_file_without_pyarrow_says_what_to_install(tmp_path, monkeypatch) -> None:
    import pandas as pd

    from we0nb.cli._common import CliError
    from we0nb.cli._target import read_prompts

    path = tmp_path / "p.parquet"
    pd.DataFrame({"prompt": ["a", "b"]}).to_parquet(path)
    assert read_prompts(str(path), None) == ["a", "b"]

    def no_engine(*a, **kw):  # what pandas raises when neither pyarrow nor fastparquet is there
        raise ImportError("Unable to find a usable engine; tried using: 'pyarrow', 'fastparquet'.")

    monkeypatch.setattr(pd, "read_parquet", no_engine)
    with pytest.raises(CliError, match=r"needs pyarrow, which is not installed here: pip install pyarrow"):
        read_prompts(str(path), None)
