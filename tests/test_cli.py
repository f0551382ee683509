"""The `we0nb` command line, run as a user would: in a subprocess, on a SQLite file."""

from __future__ import annotations

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from clikit import cli
from sql_support import PG_URL, pg_schema, pg_tables  # noqa: F401  (pg_schema: a fixture)

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("WE0NB_DB", None)
    env["PYTHONIOENCODING"] = "utf-8"
    return subprocess.run([sys.executable, "-m", "we0nb.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def ledger(db: Path) -> list[dict]:
    path = db.with_name(db.stem + ".orders.jsonl")
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def session_id_of(out: str) -> str:
    for line in out.splitlines():
        if line.strip().startswith("session ") and "ses_" in line:
            return line.split()[1]
    raise AssertionError(f"no session id in:\n{out}")


FAST = ("--delay", "0")


def test_demo_on_sqlite_aborts_mid_order_resumes_and_places_every_order_exactly_once(tmp_path):
    db = tmp_path / "demo.db"
    url = f"sqlite:///{db}"
    p = run("demo", "--db", url, *FAST, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    sid = session_id_of(out)
    assert db.exists()
    # phase 1: aborted mid-tool, nothing closed
    assert "the demo set the abort event 0.15 s after the tea order started running" in out
    assert "unfinished (time.completed is None)" in out
    # phase 2: finished calls kept, the cut order run again with its key (idempotent), nothing interrupted
    assert "recovery keep" in out and "recovery recall    place_order" in out and "recovery interrupt" not in out
    assert "run again with the same key" in out
    # the report, read back from the store and the ledger
    for needle in ("== 3. the persisted transcript", "== 4. tool calls", "recall", "keep",
                   "UnfinishedAssistantMessage", "Tea: 14 in stock", "Order ord-0002 placed: 1 x tea."):
        assert needle in out, needle
    assert "the ledger already had that key from attempt 1 and did not place it again" in out
    assert "OK: every order was placed exactly once." in out
    orders = ledger(db)
    assert [(o["item"], o["quantity"], o["session_id"], o["attempt"]) for o in orders] == [
        ("coffee", 2, sid, 1), ("tea", 1, sid, 1)]
    assert len({o["key"] for o in orders}) == 2

    # the same database, read back by other processes
    s = run("sessions", "--db", url, cwd=tmp_path)
    assert s.returncode == 0, s.stderr
    assert sid in s.stdout and "complete" in s.stdout and "1 session(s)" in s.stdout

    sh = run("show", sid, "--db", url, cwd=tmp_path)
    assert sh.returncode == 0, sh.stderr
    assert "place_order" in sh.stdout and "recall" in sh.stdout and "interrupt" not in sh.stdout
    assert "state: complete" in sh.stdout

    # resuming a finished session does nothing
    r = run("resume", sid, "--db", url, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "nothing to resume" in r.stdout
    assert len(ledger(db)) == 2


def test_demo_at_most_once_shows_the_order_in_doubt_and_what_the_model_was_told(tmp_path):
    db = tmp_path / "amo.db"
    p = run("demo", "--db", str(db), "--at-most-once", *FAST, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    assert "not idempotent (--at-most-once)" in out
    assert "recovery interrupt place_order" in out and "started but never finished (running)" in out
    assert "interrupt (resume): may have run" in out  # the tool table and the transcript, from the store
    assert "The tea order may have been placed: it was running when the run stopped" in out  # the model, told
    assert "interrupted (resume): may have run in the store; 1 order(s) in the ledger (ord-0002)" in out
    assert "the model was told it may have run" in out
    assert "OK: no order was placed twice. 1 call(s) may have run" in out and "exactly once" not in out
    assert [o["item"] for o in ledger(db)] == ["coffee", "tea"]  # it had run: the store cannot know


def test_demo_at_most_once_no_resume_then_resume_keeps_the_plain_tool(tmp_path):
    db = tmp_path / "amo2.db"
    p = run("demo", "--db", str(db), "--session", "ses_amo", "--at-most-once", "--no-resume", *FAST, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    r = run("resume", "ses_amo", "--db", str(db), *FAST, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "recovery interrupt place_order" in r.stdout and "may have run" in r.stdout
    assert [o["item"] for o in ledger(db)] == ["coffee", "tea"]


def test_demo_no_resume_then_resume_in_another_process(tmp_path):
    db = tmp_path / "two.db"  # a plain path means SQLite
    p = run("demo", "--db", str(db), "--session", "ses_cli_two", "--no-resume", *FAST, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "we0nb resume ses_cli_two" in p.stdout
    assert "recovery" not in p.stdout

    s = run("sessions", "--db", str(db), cwd=tmp_path)
    assert "ses_cli_two" in s.stdout and "needs resume" in s.stdout

    sh = run("show", "ses_cli_two", "--db", str(db), cwd=tmp_path)
    assert sh.returncode == 0 and "UNFINISHED" in sh.stdout and "running" in sh.stdout

    r = run("resume", "ses_cli_two", "--db", str(db), *FAST, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "recovery keep" in r.stdout and "recovery recall" in r.stdout and "recovery interrupt" not in r.stdout
    assert "OK: every order was placed exactly once." in r.stdout
    assert [o["item"] for o in ledger(db)] == ["coffee", "tea"]  # the tea order once, though it ran twice

    again = run("demo", "--db", str(db), "--session", "ses_cli_two", *FAST, cwd=tmp_path)
    assert again.returncode == 1 and "already exists" in again.stderr


def test_demo_in_memory_needs_no_database(tmp_path):
    p = run("demo", "--db", "memory", *FAST, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "OK: every order was placed exactly once." in p.stdout
    assert not list(tmp_path.glob("*.db"))


def test_errors_in_a_subprocess(tmp_path):
    url = f"sqlite:///{tmp_path / 'missing.db'}"
    p = run("show", "ses_x", "--db", url, cwd=tmp_path)
    assert p.returncode == 1 and "no database" in p.stderr and "Traceback" not in p.stderr
    p = run("frobnicate", cwd=tmp_path)
    assert p.returncode == 2 and "invalid choice" in p.stderr


def test_errors(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("WE0NB_DB", raising=False)
    url = f"sqlite:///{tmp_path / 'missing.db'}"
    for args in (("sessions", "--db", url), ("show", "ses_x", "--db", url), ("resume", "ses_x", "--db", url)):
        code, out, err = cli(capsys, *args)
        assert code == 1, (args, out, err)
        assert "no database" in err and "we0nb demo" in err
    assert not (tmp_path / "missing.db").exists(), "reading commands must not create a database"

    db = tmp_path / "e.db"
    assert cli(capsys, "demo", "--db", str(db), "--no-resume", "--delay", "0")[0] == 0
    code, out, err = cli(capsys, "show", "ses_nope", "--db", str(db))
    assert code == 1 and "no session 'ses_nope'" in err and "we0nb sessions" in err

    bad = tmp_path / "not-a-db.db"
    bad.write_text("this is not a database")
    code, out, err = cli(capsys, "sessions", "--db", str(bad))
    assert code == 1 and "error:" in err

    code, out, err = cli(capsys, "show", "ses_x", "--db", "memory")
    assert code == 1 and "memory" in err

    code, out, err = cli(capsys, "frobnicate")
    assert code == 2 and "invalid choice" in err
    code, out, err = cli(capsys, "show")
    assert code == 2 and "SESSION" in err
    code, out, err = cli(capsys, "demo", "--delay", "-1")
    assert code == 2 and "--delay" in err
    code, out, err = cli(capsys)
    assert code == 2 and "demo" in out


def test_resume_refuses_a_session_it_has_no_agent_for(tmp_path):
    db = tmp_path / "other.db"
    url = f"sqlite:///{db}"
    script = f"""
import asyncio
from we0nb import We0Agent, ScriptedModel, SqlPersistence, text, user_message
async def main():
    p = SqlPersistence({url!r})
    agent = We0Agent(ScriptedModel([[text("a long answer")]], delay=0.2), persistence=p)
    abort = asyncio.Event()
    asyncio.get_running_loop().call_later(0.5, abort.set)
    try:
        await agent.invoke(abort=abort, session_id="ses_other", messages=[user_message("hello")])
    except asyncio.CancelledError:
        pass
    await p.close()
asyncio.run(main())
"""
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    p = run("resume", "ses_other", "--db", url, cwd=tmp_path)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "not written by `we0nb demo`" in p.stderr and "mode='resume'" in p.stderr
    sh = run("show", "ses_other", "--db", url, cwd=tmp_path)
    assert sh.returncode == 0 and "needs resume" in sh.stdout


def test_help_and_python_dash_m(tmp_path, capsys):
    env = dict(os.environ, PYTHONIOENCODING="utf-8")
    p = subprocess.run([sys.executable, "-m", "we0nb", "--help"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0
    for cmd in ("demo", "sessions", "show", "resume", "lab"):
        assert cmd in p.stdout
    for cmd in ("demo", "sessions", "show", "resume", "lab"):
        code, out, err = cli(capsys, cmd, "--help")
        assert code == 0 and "usage: we0nb " + cmd in out
        if cmd != "lab":
            assert "--db" in out


def test_lab_dry_run(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    code, out, err = cli(capsys, "lab", "--dry-run")
    assert code == 0, err
    assert "-m jupyter lab" in out and str(ROOT / "notebooks") in out
    code, out, err = cli(capsys, "lab", "--dry-run", "--", "--port", "9999")
    assert out.rstrip().endswith("--port 9999")
    monkeypatch.chdir(tmp_path)
    import we0nb.cli.lab as lab

    monkeypatch.setattr(lab, "notebooks_dir", lambda: None)  # a wheel install, without its tutorials
    monkeypatch.setattr(lab, "shipped_tutorials", lambda: None)
    code, out, err = cli(capsys, "lab", "--dir", str(tmp_path / "nowhere"))
    assert code == 1 and "tutorials" in err and not (tmp_path / "nowhere").exists()


def test_lab_copies_the_shipped_tutorials_to_the_folder_named(tmp_path, capsys, monkeypatch):
    """A wheel user has no clone: `we0nb lab --dir DIR` copies the installed tutorials into DIR, keeps a
    file already there (their edits), and opens DIR."""
    import we0nb.cli.lab as lab

    shipped = tmp_path / "share" / "we0nb" / "notebooks"
    shipped.mkdir(parents=True)
    for f in (ROOT / "notebooks").glob("*.ipynb"):
        (shipped / f.name).write_bytes(f.read_bytes())
    (shipped / "data").mkdir()
    (shipped / "data" / "local-recording.db").write_bytes(b"recorded")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(lab, "notebooks_dir", lambda: None)
    monkeypatch.setattr(lab, "shipped_tutorials", lambda: shipped)
    code, out, err = cli(capsys, "lab", "--dry-run")
    assert code == 1 and "we0nb lab --dir" in err  # asks where to put them
    mine = tmp_path / "mine"
    code, out, err = cli(capsys, "lab", "--dir", str(mine), "--dry-run")
    assert code == 0 and "Would copy" in out and not mine.exists()
    mine.mkdir()
    (mine / "01-quickstart.ipynb").write_text("my edits")
    monkeypatch.setattr(lab.subprocess, "call", lambda cmd: print("ran", *cmd) or 0)
    code, out, err = cli(capsys, "lab", "--dir", str(mine))
    assert code == 0, err
    n = len(list(shipped.glob("*.ipynb")))
    assert f"Copied {n - 1 + 1} tutorial files to {mine}." in out and f"jupyter lab {mine}" in out
    assert (mine / "01-quickstart.ipynb").read_text() == "my edits"
    assert (mine / "data" / "local-recording.db").read_bytes() == b"recorded"  # tutorial 10 replays it
    assert sorted(p.name for p in mine.glob("*.ipynb")) == sorted(p.name for p in shipped.glob("*.ipynb"))


def test_the_wheel_ships_every_tutorial():
    """pyproject's data-files put notebooks/*.ipynb in the wheel (share/we0nb/notebooks), where
    `we0nb lab` finds them, and the data a tutorial reads (share/we0nb/notebooks/data)."""
    from we0nb.cli.lab import TUTORIAL_DATA

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    files = meta["tool"]["setuptools"]["data-files"]
    assert "notebooks/*.ipynb" in files["share/we0nb/notebooks"]
    for name in TUTORIAL_DATA:
        assert (ROOT / "notebooks" / name).is_file()
        folder = "share/we0nb/notebooks/" + name.rpartition("/")[0]
        assert f"notebooks/{name}" in files[folder]


def test_lab_without_jupyterlab_says_so_and_copies_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "jupyterlab", None)  # (import jupyterlab then fails)
    mine = tmp_path / "mine"
    code, out, err = cli(capsys, "lab", "--dir", str(mine))
    assert code == 1 and "pip install jupyterlab" in err and not mine.exists()


BLOCK_PSYCOPG = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "psycopg":
            raise ImportError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Block())
from we0nb.cli import main
sys.exit(main(sys.argv[1:]))
"""


def one_line_error(p: subprocess.CompletedProcess, code: int = 1) -> str:
    assert p.returncode == code, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr + p.stdout
    lines = p.stderr.strip().splitlines()
    assert 1 <= len(lines) <= 4, p.stderr
    return p.stderr


@pytest.mark.parametrize("args", [("sessions",), ("show", "ses_x"), ("resume", "ses_x"), ("demo",)])
def test_postgres_url_without_psycopg_is_one_line(tmp_path, args):
    env = dict(os.environ, PYTHONIOENCODING="utf-8")
    p = subprocess.run([sys.executable, "-c", BLOCK_PSYCOPG, *args, "--db", "postgresql://u@127.0.0.1:5432/x"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    err = one_line_error(p)
    assert 'pip install "we0nb[postgres]"' in err and "psycopg" in err


def test_bad_inputs_end_in_a_few_lines(tmp_path):
    db = tmp_path / "ok.db"
    assert run("demo", "--db", str(db), "--no-resume", "--session", "my session", *FAST, cwd=tmp_path).returncode == 0
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    cases = [
        (("sessions", "--db", "mysql://u@h/db"), "SQLite or PostgreSQL"),
        (("sessions", "--db", "postgresql://u@h:notaport/db"), "is not a database URL"),
        (("sessions", "--db", "postgresql://u@127.0.0.1:1/db"), "cannot read the database"),
        (("sessions", "--db", str(tmp_path)), "is a folder"),
        (("sessions", "--db", str(empty)), "no we0nb data in"),
        (("show", "bad\tid", "--db", str(db)), "printable"),
        (("show", "x" * 300, "--db", str(db)), "at most 255"),
        (("resume", "", "--db", str(db)), "must not be empty"),
        (("demo", "--db", str(tmp_path / "no" / "such" / "dir" / "x.db"), *FAST), "error:"),
        (("demo", "--db", ""), "--db is empty"),
    ]
    for args, needle in cases:
        err = one_line_error(run(*args, cwd=tmp_path))
        assert needle in err, (args, err)
    assert empty.read_bytes() == b"", "a read-only command wrote to the database"
    p = run("demo", "--bogus", cwd=tmp_path)
    assert p.returncode == 2 and "usage: we0nb demo" in p.stderr and "unrecognized arguments: --bogus" in p.stderr
    # --debug adds the traceback
    p = run("demo", "--debug", "--db", str(tmp_path / "no" / "such" / "dir" / "x.db"), *FAST, cwd=tmp_path)
    assert p.returncode == 1 and "Traceback" in p.stderr


def test_hints_are_shell_quoted(tmp_path):
    db = tmp_path / "a b.db"
    p = run("demo", "--db", str(db), "--session", "my session", "--no-resume", *FAST, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    import shlex

    line = next(x for x in p.stdout.splitlines() if x.strip().startswith("we0nb resume"))
    argv = shlex.split(line)
    assert argv[:3] == ["we0nb", "resume", "my session"] and argv[4] == f"sqlite:///{db}"
    r = run(*argv[1:], *FAST, cwd=tmp_path)
    assert r.returncode == 0 and "OK: every order was placed exactly once." in r.stdout, r.stdout + r.stderr


@pytest.mark.postgres
def test_reading_commands_never_create_tables_on_postgres(tmp_path, pg_schema):
    scoped = f"{PG_URL}?options=-csearch_path%3D{pg_schema}"
    for args in (("sessions",), ("show", "ses_x")):
        err = one_line_error(run(*args, "--db", scoped, cwd=tmp_path))
        assert "no we0nb data in" in err
    assert pg_tables(pg_schema) == []


def test_lab_passes_unknown_options_to_jupyter(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    code, out, err = cli(capsys, "lab", "--dry-run", "--no-browser", "--port", "8890")
    assert code == 0, err
    assert out.rstrip().endswith("--no-browser --port 8890")
    assert ("--allow-root" in out) == (os.geteuid() == 0)
    code, out, err = cli(capsys, "--help")
    assert "lab passes the options it does not know to jupyter lab" in " ".join(out.split())


def test_the_readme_sample_is_what_the_demo_prints(tmp_path):
    """Every line of the docs' sample output (but the elided "...") is printed by `we0nb demo`."""
    page = (ROOT / "docs" / "getting-started.md").read_text()
    section = page.split("## The demo: one command", 1)[1]
    import re

    samples = [body for lang, body in re.findall(r"```(\w*)\n(.*?)```", section, re.S) if not lang]
    assert len(samples) >= 2  # the demo, then `we0nb demo --at-most-once`
    for sample, args in zip(samples, [(), ("--at-most-once",)]):
        cwd = tmp_path / ("_".join(args) or "default")  # (a database and ledger of its own)
        cwd.mkdir()
        p = run("demo", *args, cwd=cwd)
        assert p.returncode == 0, p.stdout + p.stderr
        printed = p.stdout.splitlines()
        lines = [line for line in sample.splitlines() if line.strip() and line.strip() != "..."]
        assert len(lines) >= 4
        for line in lines:
            assert line in printed, line


def test_a_file_that_is_not_a_database_is_explained_in_the_command_lines_words(tmp_path, capsys, monkeypatch):
    """Issue 36, item 12: a CLI error names --db, not the Python API."""
    monkeypatch.chdir(tmp_path)
    notes = tmp_path / "notes.txt"
    notes.write_text("shopping: tea, coffee\n" * 200)
    for args in (("sessions", "--db", f"sqlite:///{notes}"), ("show", "ses_x", "--db", f"sqlite:///{notes}")):
        code, out, err = cli(capsys, *args)
        assert code == 1, (args, out, err)
        assert "not a we0nb database" in err and "another --db" in err, err
        assert "SqlPersistence" not in err and "Traceback" not in err, err


def test_a_table_named_like_ours_but_not_ours_is_said_so(tmp_path, capsys, monkeypatch):
    """A database with a we0_sessions of another program: the reading commands say so (they said it
    had no we0nb tables), and a writing command refuses it (the first read failed on a missing column)."""
    import sqlite3

    monkeypatch.chdir(tmp_path)
    db = tmp_path / "other.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE we0_sessions (x INTEGER)")
    url = f"sqlite:///{db}"
    code, out, err = cli(capsys, "sessions", "--db", url)
    assert code == 1 and "has a table named we0_sessions that we0nb did not make" in err, err
    code, out, err = cli(capsys, "demo", "--db", url)
    assert code == 1 and "already has a table named we0_sessions that we0nb did not make" in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
