"""`we0nb fork SESSION [--at MESSAGE]` (SPEC §12), as a user runs it: in a subprocess, on SQLite."""

from __future__ import annotations

import asyncio

from test_cli import FAST, ledger, run
from we0nb import SqlPersistence


def _messages(db, sid):
    async def go():
        p = SqlPersistence(f"sqlite:///{db}")
        try:
            return await p.load_transcript(sid)
        finally:
            await p.close()

    return asyncio.run(go())


def test_fork_the_aborted_demo_then_resume_the_fork(tmp_path):
    db = tmp_path / "f.db"
    p = run("demo", "--db", str(db), "--session", "ses_src", "--no-resume", *FAST, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    placed = len(ledger(db))
    at = _messages(db, "ses_src").messages[-1].info.id
    f = run("fork", "ses_src", "--at", at, "--as", "ses_fork", "--db", str(db), cwd=tmp_path)
    assert f.returncode == 0, f.stdout + f.stderr
    assert "forked ses_src at message" in f.stdout and "into ses_fork" in f.stdout and "we0nb resume ses_fork" in f.stdout
    tr = _messages(db, "ses_fork")
    assert tr.session.forked_from == "ses_src" and tr.session.forked_at == at
    reasons = {p.interrupt_reason for m in tr.messages for p in m.tool_parts if p.interrupted}
    assert reasons == {"fork"} and len(ledger(db)) == placed  # nothing ran
    r = run("resume", "ses_fork", "--db", str(db), *FAST, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert _messages(db, "ses_src").messages[-1].info.id == at  # the source is unchanged


def test_fork_bad_input_is_one_line_and_writes_nothing(tmp_path):
    db = tmp_path / "g.db"
    assert run("demo", "--db", str(db), "--session", "ses_g", *FAST, cwd=tmp_path).returncode == 0
    for args, words in ((("ses_nope",), f"no session 'ses_nope' in sqlite:///{db}"),
                        (("ses_g", "--at", "msg_nope"), "session 'ses_g' has no such message"),
                        (("ses_g", "--as", "ses_g"), "is the session being forked")):
        p = run("fork", *args, "--db", str(db), cwd=tmp_path)
        assert p.returncode == 1 and words in p.stderr and "Nothing was written" in p.stderr, p.stderr
        assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr
    missing = tmp_path / "missing.db"
    p = run("fork", "ses_g", "--db", str(missing), cwd=tmp_path)
    assert p.returncode == 1 and not missing.exists()
    s = run("sessions", "--db", str(db), cwd=tmp_path)
    assert s.stdout.count("ses_") == 1  # only the demo's session
