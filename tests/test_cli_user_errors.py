"""Mistakes a user can make on the command line, each answered in one line in the command line's
own words (its flags, its commands), without writing anything and without a password shown."""

from __future__ import annotations

import asyncio
import sqlite3
import time
import uuid
from pathlib import Path

import pytest

from clikit import cli
from sql_support import PG_URL, pg_schema, pg_tables  # noqa: F401  (pg_schema: a fixture)
from we0nb import FunctionModel, SqlPersistence, We0Agent, text, user_message

AGENTS = """\
import sys
from we0nb import We0Agent, FunctionModel, text

agent = We0Agent(FunctionModel(lambda r: [text("a short answer")], keep_requests=False))
number = 42


def returns_none():
    return None


def exits():
    sys.exit(0)
"""


def one_line(result: tuple[int, str, str], code: int = 1) -> str:
    got, out, err = result
    assert got == code, (got, out, err)
    assert "Traceback" not in out + err and "a bug in we0nb" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 or code == 2, err
    return lines[-1]


@pytest.fixture
def here(tmp_path, monkeypatch):
    """tmp_path as the current folder, without $WE0NB_DB, with a prompts file and an agents module
    of a name of its own (so a module imported by one test is not another's)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("WE0NB_DB", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = f"agents_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{mod}.py").write_text(AGENTS)
    (tmp_path / "p.jsonl").write_text('"hello"\n"world"\n')
    return tmp_path, mod


def other_app_db(path: Path) -> Path:
    conn = sqlite3.connect(path)
    conn.execute("create table users(id int)")
    conn.commit()
    conn.close()
    return path


def tables(path: Path) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return sorted(r[0] for r in conn.execute("select name from sqlite_master where type = 'table'"))
    finally:
        conn.close()


def demo_db(capsys, path: Path) -> Path:
    assert cli(capsys, "demo", "--db", str(path), "--delay", "0", "--no-resume", "--session", "ses_d")[0] == 0
    return path


# --------------------------------------------------------------------------- 1, 8, 9: the agent


def test_an_agent_that_exits_while_loading_is_one_line_and_not_exit_0(here, capsys) -> None:
    tmp, mod = here
    (tmp / f"{mod}_x.py").write_text("import sys\nsys.exit(3)\n")
    tail = ("--prompts", "p.jsonl", "--name", "b", "--db", str(tmp / "x.db"))
    line = one_line(cli(capsys, "batch", "run", f"{mod}:exits", *tail))
    assert f"calling {mod}:exits() exited with code 0" in line, line
    line = one_line(cli(capsys, "batch", "run", f"{mod}_x:agent", *tail))
    assert f"importing '{mod}_x'" in line and "exited with code 3" in line, line
    line = one_line(cli(capsys, "batch", "work", f"{mod}:exits", "b"))  # (no --db: the agent's own store)
    assert "exited with code 0" in line, line
    assert not (tmp / "x.db").exists()


def test_a_module_getattr_that_raises_is_the_modules_error(here, capsys) -> None:
    tmp, mod = here
    (tmp / f"{mod}_g.py").write_text("def __getattr__(name):\n    raise RuntimeError('boom ' + name)\n")
    line = one_line(cli(capsys, "batch", "run", f"{mod}_g:x", "--prompts", "p.jsonl", "--name", "b",
                        "--db", str(tmp / "x.db")))
    assert f"{mod}_g:x failed: RuntimeError: boom x" in line, line


def test_what_is_not_an_agent_is_said_grammatically(here, capsys) -> None:
    tmp, mod = here
    tail = ("--prompts", "p.jsonl", "--name", "b", "--db", str(tmp / "x.db"))
    line = one_line(cli(capsys, "batch", "run", f"{mod}:returns_none", *tail))
    assert f"{mod}:returns_none() returned None, not a We0Agent" in line, line
    line = one_line(cli(capsys, "batch", "run", f"{mod}:number", *tail))
    assert f"{mod}:number is an int, not a We0Agent" in line, line


# --------------------------------------------------------------------------- 2, 3: databases not ours


def test_batch_work_writes_nothing_to_a_database_without_the_batch(here, capsys) -> None:
    tmp, mod = here
    other = other_app_db(tmp / "other.db")
    line = one_line(cli(capsys, "batch", "work", f"{mod}:agent", "cc", "--db", str(other)))
    assert "no we0nb data in" in line and "we0nb batch run" in line, line
    assert tables(other) == ["users"]
    line = one_line(cli(capsys, "batch", "work", f"{mod}:agent", "cc", "--db", str(tmp / "nope.db")))
    assert "no database at" in line, line
    assert not (tmp / "nope.db").exists()
    db = demo_db(capsys, tmp / "d.db")
    before = tables(db)
    line = one_line(cli(capsys, "batch", "work", f"{mod}:agent", "cc", "--db", str(db)))
    assert "no batch 'cc' in" in line and "we0nb batch run" in line, line
    assert tables(db) == before


def _newer(path: Path) -> Path:
    conn = sqlite3.connect(path)
    conn.execute("update we0_meta set value = '999' where key = 'schema_version'")
    conn.commit()
    conn.close()
    return path


def _broken_parts(path: Path) -> Path:
    conn = sqlite3.connect(path)
    conn.executescript("drop table we0_parts; create table we0_parts(x int);")
    conn.close()
    return path


def test_batch_ls_and_show_refuse_what_sessions_refuses(here, capsys) -> None:
    tmp, _ = here
    empty = tmp / "empty.db"
    empty.write_bytes(b"")
    cases = [
        (other_app_db(tmp / "other.db"), "no we0nb data in"),
        (empty, "no we0nb data in"),
        (_newer(demo_db(capsys, tmp / "new.db")), "written by a newer we0nb"),
        (_broken_parts(demo_db(capsys, tmp / "broken.db")), "damaged"),
    ]
    for db, words in cases:
        before = tables(db)
        for args in (("batch", "ls"), ("batch", "show", "x")):
            line = one_line(cli(capsys, *args, "--db", str(db)))
            assert words in line, (args, db, line)
        assert words in one_line(cli(capsys, "sessions", "--db", str(db))), db
        assert tables(db) == before
    assert empty.read_bytes() == b""


@pytest.mark.postgres
def test_batch_ls_and_show_refuse_a_postgres_database_without_we0nb_data(here, capsys, pg_schema) -> None:
    scoped = f"{PG_URL}?options=-csearch_path%3D{pg_schema}"
    for args in (("batch", "ls"), ("batch", "show", "x")):
        assert "no we0nb data in" in one_line(cli(capsys, *args, "--db", scoped))
    assert pg_tables(pg_schema) == []


# --------------------------------------------------------------------------- 4, 5: passwords


def test_help_never_shows_a_password(here, capsys, monkeypatch) -> None:
    monkeypatch.setenv("WE0NB_DB", "postgresql://u:secretpw@127.0.0.1:1/x")
    from we0nb.cli import _parsers

    _, commands = _parsers()
    for name in [*commands, "batch ls", "batch show", "batch run", "batch work"]:
        code, out, err = cli(capsys, *name.split(), "--help")
        assert code == 0 and "secretpw" not in out + err, name
    code, out, _ = cli(capsys, "sessions", "--help")
    assert "postgresql://u:***@127.0.0.1:1/x" in " ".join(out.split())
    # a % in the URL is not taken for argparse's formatting (it was a ValueError traceback)
    monkeypatch.setenv("WE0NB_DB", "postgresql://u:pw@h/db?options=-csearch_path%3Dx")
    code, out, err = cli(capsys, "sessions", "--help")
    assert code == 0 and "postgresql://u:***@h/db?options=-csearch_path%3Dx" in " ".join(out.split()), err


def test_a_url_that_does_not_parse_hides_its_password(here, capsys) -> None:
    for url in ("postgresql://postgres:s3cretpw@127.0.0.1:abc/test", "postgresql://postgres:s3cretpw@[bad/test"):
        line = one_line(cli(capsys, "sessions", "--db", url))
        assert "s3cretpw" not in line and "***" in line, line


# --------------------------------------------------------------------------- 6, 7: numbers


@pytest.mark.timeout(60)  # (before the fix the demo waited forever)
@pytest.mark.parametrize("args", [("demo", "--delay", "inf"), ("demo", "--delay", "1e300"),
                                  ("demo", "--abort-after", "inf"), ("resume", "ses_x", "--delay", "-inf")])
def test_a_number_that_never_ends_is_a_usage_error(here, capsys, args) -> None:
    tmp, _ = here
    line = one_line(cli(capsys, *args, "--db", str(tmp / "n.db")), code=2)
    assert args[-2] in line, line
    assert not (tmp / "n.db").exists()


@pytest.mark.parametrize("flag", ["--concurrency", "--max-failures"])
def test_huge_worker_counts_are_a_usage_error_before_anything_is_created(here, capsys, flag) -> None:
    tmp, mod = here
    line = one_line(cli(capsys, "batch", "run", f"{mod}:agent", "--prompts", "p.jsonl", "--name", "big",
                        "--db", str(tmp / "c.db"), flag, "99999999999999999999"), code=2)
    assert flag in line and "at most" in line, line
    assert not (tmp / "c.db").exists()


# --------------------------------------------------------------------------- 10, 11: prompts files


def test_a_jsonl_file_that_is_not_utf8_names_the_file_and_line(here, capsys) -> None:
    tmp, mod = here
    (tmp / "bad.jsonl").write_bytes(b'"fine"\n\xff\xfe bad utf8\n')
    line = one_line(cli(capsys, "batch", "run", f"{mod}:agent", "--prompts", "bad.jsonl", "--name", "b",
                        "--db", str(tmp / "x.db")))
    assert "bad.jsonl, line 2" in line and "UTF-8" in line, line


def test_jsonl_objects_without_the_prompts_column_name_the_line(here, capsys) -> None:
    tmp, mod = here
    (tmp / "keys.jsonl").write_text('{"prompt": "a"}\n{"x": "b"}\n')
    line = one_line(cli(capsys, "batch", "run", f"{mod}:agent", "--prompts", "keys.jsonl", "--name", "k",
                        "--db", str(tmp / "k.db")))
    assert "keys.jsonl, line 2" in line and "'prompt'" in line, line
    assert not (tmp / "k.db").exists()


# --------------------------------------------------------------------------- 12: lab


@pytest.mark.parametrize("dry", [True, False])
def test_lab_dir_that_is_a_file_is_refused(here, capsys, dry) -> None:
    tmp, _ = here
    (tmp / "afile").write_text("mine\n")
    line = one_line(cli(capsys, "lab", "--dir", "afile", *(["--dry-run"] if dry else [])))
    assert "--dir must be a folder" in line, line
    assert (tmp / "afile").read_text() == "mine\n"


# --------------------------------------------------------------------------- 13: the command line's words


def test_batch_names_are_checked_in_the_flags_words(here, capsys) -> None:
    tmp, mod = here
    tail = ("--prompts", "p.jsonl", "--db", str(tmp / "x.db"))
    line = one_line(cli(capsys, "batch", "run", f"{mod}:agent", *tail, "--name", ""))
    assert "--name must not be empty" in line and "batch(" not in line, line
    line = one_line(cli(capsys, "batch", "run", f"{mod}:agent", *tail, "--name", "n" * 3000))
    assert "--name is 3000 characters long" in line and "batch names" in line, line
    assert "session ids" not in line and "batch(" not in line
    assert not (tmp / "x.db").exists()


def test_fork_speaks_in_its_flags(here, capsys) -> None:
    tmp, _ = here
    db = str(demo_db(capsys, tmp / "f.db"))
    line = one_line(cli(capsys, "fork", "ses_d", "--as", "", "--db", db))
    assert "--as must not be empty" in line and "fork(" not in line, line
    line = one_line(cli(capsys, "fork", "ses_d", "--at", "msg_nope", "--db", db))
    assert "--at 'msg_nope'" in line and "we0nb show ses_d --db" in line, line
    assert "fork(" not in line and "agent.transcript" not in line
    line = one_line(cli(capsys, "fork", "nope", "--db", db))
    assert f"no session 'nope' in sqlite:///{db}" in line and "we0nb sessions --db" in line, line
    line = one_line(cli(capsys, "fork", "ses_d", "--as", "ses_d", "--db", db))
    assert "--as" in line and "fork(" not in line, line
    code, out, _ = cli(capsys, "sessions", "--db", db)
    assert out.count("ses_") == 1


def test_batch_show_of_an_unfinished_batch_names_the_worker_command(here, capsys) -> None:
    tmp, _ = here
    db = tmp / "u.db"

    async def unfinished() -> None:
        from we0nb.persistence.batches import NewItem, batch_queue

        p = SqlPersistence(f"sqlite:///{db}")
        try:
            await batch_queue(p).open_batch("cc", [NewItem('"hello"', "ses_1")], session_ids_given=False,
                                            now=time.time())
        finally:
            await p.close()

    asyncio.run(unfinished())
    code, out, err = cli(capsys, "batch", "show", "cc", "--db", str(db))
    assert code == 0, err
    assert f"we0nb batch work MODULE:ATTR cc --db sqlite:///{db}" in out and "agent.batch" not in out, out


# --------------------------------------------------------------------------- 14: database words


def test_database_messages_say_what_was_given(here, capsys, monkeypatch) -> None:
    tmp, _ = here
    db = demo_db(capsys, tmp / "demo.db")
    monkeypatch.setenv("WE0NB_DB", "")
    line = one_line(cli(capsys, "sessions"))
    assert "$WE0NB_DB is empty" in line and "--db is empty" not in line, line
    assert "$WE0NB_DB is empty" in one_line(cli(capsys, "batch", "ls"))
    monkeypatch.delenv("WE0NB_DB")
    line = one_line(cli(capsys, "sessions", "--db", f"sqlite:///file:{db}?mode=ro&uri=true"))
    assert "file: URIs are not supported" in line and f"sqlite:///{db}" in line and "in-memory" not in line, line
    code, out, err = cli(capsys, "sessions", "--db", f"SQLITE:///{db}")
    assert code == 0 and "ses_d" in out, err
    assert one_line(cli(capsys, "batch", "ls", "--db", "memory")) .split("error: ")[1] == \
        one_line(cli(capsys, "sessions", "--db", "memory")).split("error: ")[1]
    line = one_line(cli(capsys, "demo", "--session", "", "--db", str(db), "--delay", "0"))
    assert "--session must not be empty" in line, line


# --------------------------------------------------------------------------- 15: escape codes


def test_escape_codes_in_stored_data_are_shown_escaped(here, capsys) -> None:
    tmp, _ = here
    db = tmp / "esc.db"

    async def write() -> None:
        from we0nb.messages import Session, SessionTime

        p = SqlPersistence(f"sqlite:///{db}")
        try:
            agent = We0Agent(FunctionModel(lambda r: [text("\x1b[31mred\x1b[0m\nnext\x07")]), persistence=p)
            await agent.invoke(session_id="ses_e", messages=[user_message("hi")])
            s = await p.get_session("ses_e")
            t = time.time()
            await p.upsert_session(Session(id="ses_e", title="\x1b[2Jtitle",
                                           time=SessionTime(created=s.time.created if s else t, updated=t)))
        finally:
            await p.close()

    asyncio.run(write())
    for args in (("sessions",), ("show", "ses_e")):
        code, out, err = cli(capsys, *args, "--db", str(db))
        assert code == 0, err
        assert "\x1b" not in out and "\x07" not in out and "\\x1b" in out, (args, out)


# --------------------------------------------------------------------------- 16, 17


def test_a_bad_option_of_a_batch_command_shows_that_commands_usage(here, capsys) -> None:
    code, out, err = cli(capsys, "batch", "ls", "--dbb", "x")
    assert code == 2 and "usage: we0nb batch ls" in err and "unrecognized arguments: --dbb x" in err, err


def test_the_cost_line_names_no_others_when_there_are_none() -> None:
    from we0nb import MemoryPersistence
    from we0nb.cli.render import session_cost

    async def go():
        p = MemoryPersistence()
        agent = We0Agent(FunctionModel(lambda r: [text("a")]), persistence=p)
        await agent.invoke(session_id="ses_c", messages=[user_message("hi")])
        return await p.load_transcript("ses_c")

    line = session_cost(asyncio.run(go()))
    assert line.startswith("unknown") and "others" not in line, line
