"""The command line's approval: `we0nb approvals` (reads only), `we0nb approve` / `we0nb deny` (one line
for every bad input, never a traceback), `we0nb resume` after the decisions, and `we0nb demo --approve`,
whose every claim about the run is checked against the store and the ledger (the demo's standard)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sql_support import PG_URL, pg_schema, pg_tables  # noqa: F401  (pg_schema: a fixture)
from test_cli import cli, one_line_error, run
from test_cli_demo_honesty import _block, _table, ledger, load, sid_of, truth_rows

FAST = ("--delay", "0")


# --------------------------------------------------------------------------- the truth, and the claims


def check_approval_demo(out: str, db: Path, sid: str) -> dict:
    """Every claim of a `we0nb demo --approve` output against the store and the ledger."""
    tr = load(db, sid)
    calls = {json.dumps([p.tool, p.state.input], sort_keys=True): p for m in tr.messages for p in m.tool_parts}
    # model's arguments too (a corrected call's state holds what ran)
    for m in tr.messages:
        for p in m.tool_parts:
            if p.approval_detail is not None and p.approval_detail.original_input is not None:
                calls[json.dumps([p.tool, p.approval_detail.original_input], sort_keys=True)] = p
    orders = ledger(db, sid)
    lines = out.splitlines()
    seen = {"decisions": 0, "recovery": 0, "awaiting": 0}
    for i, line in enumerate(lines):
        if m := re.match(r"  (approved|denied)\s+(\w+)\((\{.*?\})\)( with reason '(.*)')? \(decided (.*) UTC, read back", line):
            p = calls[json.dumps([m[2], json.loads(m[3])], sort_keys=True)]
            assert p.approval == m[1], (line, p.approval)
            assert (p.approval_detail.reason or None) == m[5], line
            seen["decisions"] += 1
        elif m := re.match(r"  awaiting  (\w+)\((\{.*?\})\): (.*)$", line):
            p = calls[json.dumps([m[1], json.loads(m[2])], sort_keys=True)]
            assert p.approval is not None and p.approval_detail.why == m[3]
            seen["awaiting"] += 1
        elif m := re.match(r"  recovery (execute|deny|await|keep|recall|interrupt)\s+(\w+)\((\{.*?\})\): (.*)$", line):
            p = calls[json.dumps([m[2], json.loads(m[3])], sort_keys=True)]
            if m[1] in ("keep", "recall", "interrupt"):
                assert {"keep": p.finished and not p.recalled and not p.interrupted, "recall": p.recalled,
                        "interrupt": p.interrupted}[m[1]], (line, p.state)
            elif m[1] == "deny":
                assert p.approval == "denied" and p.state.status == "error" and p.state.metadata["denied"] is True
                reason = p.approval_detail.reason
                assert ("a person denied it" in m[4]) and ((f"({reason})" in m[4]) == bool(reason))
            elif m[1] == "execute":
                assert p.state.status in ("completed", "error") and not p.interrupted, (line, p.state)
                assert ("a person approved it" in m[4]) == (p.approval == "approved"), line
            seen["recovery"] += 1
        elif line.startswith("== 4."):
            assert _table(_block(lines, i)) == truth_rows(tr)
        elif m := re.match(r"  (place_order)\((\{.*?\})\): (.*) in the store; (\d+) order\(s\) in the ledger", line):
            p = calls[json.dumps(["place_order", json.loads(m[2])], sort_keys=True)]
            state = "denied" if p.approval == "denied" and p.finished else p.state.status
            assert m[3] == state, line
            mine = [o for o in orders if o["item"] == p.state.input["item"] and o["quantity"] == p.state.input["quantity"]]
            assert int(m[4]) == len(mine)
    for p in calls.values():  # no denied call ever ran; an approved one ran at most once
        if p.approval == "denied":
            assert not [o for o in orders if o["item"] == p.state.input["item"]
                        and o["quantity"] == p.state.input["quantity"]], p
    items = [(o["item"], o["quantity"]) for o in orders]
    assert len(items) == len(set(items)), "an order was placed twice"
    for m in tr.messages:  # the model's words come from its tool results
        for item in re.findall(r"The (\w+) order was denied by a person", m.text):
            assert any(p.tool == "place_order" and p.state.input["item"] == item and p.approval == "denied"
                       for p in calls.values())
    return seen


def calls_of(db: Path, sid: str) -> dict[str, str]:
    """item → call id of the session's place_order calls."""
    return {p.state.input["item"]: p.call_id for m in load(db, sid).messages for p in m.tool_parts
            if p.tool == "place_order"}


# --------------------------------------------------------------------------- the demo


def test_demo_approve_decides_resumes_and_says_only_what_the_store_holds(tmp_path, capsys):
    db = tmp_path / "a.db"
    code, out, err = cli(capsys, "demo", "--approve", "--db", str(db), *FAST)
    assert code == 0, out + err
    sid = sid_of(out)
    assert "[finish] result='approval'" in out and "== 2. approval: a person decides" in out
    seen = check_approval_demo(out, db, sid)
    assert seen == {"decisions": 2, "recovery": 3, "awaiting": 2}, seen
    assert "OK: no order was placed twice." in out
    tr = load(db, sid)
    assert [(p.tool, p.approval, p.state.status) for p in tr.messages[1].tool_parts] == [
        ("place_order", "approved", "completed"), ("check_stock", None, "completed"),
        ("place_order", "denied", "error")]
    assert [(o["item"], o["quantity"]) for o in ledger(db, sid)] == [("coffee", 2)]
    assert "The tea order was denied by a person (no tea this week): not placed." in tr.messages[-1].text
    # the store, read by other commands
    s = run("sessions", "--db", str(db), cwd=tmp_path)
    assert sid in s.stdout and "complete" in s.stdout
    sh = run("show", sid, "--db", str(db), cwd=tmp_path)
    assert "[completed] approved" in sh.stdout and "[error] denied" in sh.stdout and "state: complete" in sh.stdout


@pytest.mark.parametrize("n", [1, 3, 5, 18, 19, 20, 21, 22, 23, 24, 25])  # 19-24: the calls and the requests
def test_demo_approve_aborted_after_any_event_claims_still_hold(tmp_path, capsys, n):
    db = tmp_path / "n.db"
    code, out, err = cli(capsys, "demo", "--approve", "--db", str(db), "--abort-at-event", str(n), *FAST)
    assert code == 0, out + err
    sid = sid_of(out)
    check_approval_demo(out, db, sid)
    tr = load(db, sid)
    assert not tr.pending_approvals and not tr.needs_resume
    # (cut before the model asked for the tea order, the one order left is placed exactly once)
    assert "OK: no order was placed twice." in out or "OK: every order was placed exactly once." in out
    assert ("coffee", 2) in [(o["item"], o["quantity"]) for o in ledger(db, sid)]


def test_no_resume_then_decide_and_resume_from_other_processes(tmp_path):
    db = tmp_path / "b c.db"
    url = f"sqlite:///{db}"
    p = run("demo", "--approve", "--no-resume", "--session", "ses approve", "--db", url, *FAST, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "Stopped at the request (--no-resume)" in p.stdout and "recovery" not in p.stdout
    ids = calls_of(db, "ses approve")
    # the printed commands are ready to paste: approve the coffee, deny the tea with a reason, resume
    import shlex

    pasted = [shlex.split(line.split("    # ")[0]) for line in p.stdout.splitlines()
              if line.strip().startswith(("we0nb approve", "we0nb deny", "we0nb resume"))]
    assert [a[1] for a in pasted] == ["approve", "deny", "resume"]
    assert pasted[0][2:4] == ["ses approve", ids["coffee"]] and pasted[1][3] == ids["tea"]
    assert run("sessions", "--db", url, cwd=tmp_path).stdout.count("awaiting approval") == 1
    sh = run("show", "ses approve", "--db", url, cwd=tmp_path)
    assert sh.stdout.count("[pending] (awaiting approval)") == 2 and "state: awaiting approval" in sh.stdout

    a = run("approvals", "--db", url, cwd=tmp_path)
    assert a.returncode == 0 and ids["coffee"] in a.stdout and ids["tea"] in a.stdout
    assert "2 call(s) await a decision" in a.stdout and "place_order requires approval for every call" in a.stdout

    r = run("resume", "ses approve", "--db", url, *FAST, cwd=tmp_path)
    err = one_line_error(r)
    assert "waits for a person's decision on 2 call(s)" in err and "we0nb approvals" in err

    ap = run("approve", "ses approve", ids["coffee"], "--input", '{"item": "coffee", "quantity": 3}', "--db", url,
             cwd=tmp_path)
    assert ap.returncode == 0, ap.stderr
    assert "corrected arguments" in ap.stdout and "1 call(s) of this session still await a decision" in ap.stdout
    d = run("deny", "ses approve", ids["tea"], "--reason", "not <today>", "--db", url, cwd=tmp_path)
    assert d.returncode == 0, d.stderr
    assert "(reason: not <today>)" in d.stdout and "we0nb resume 'ses approve'" in d.stdout
    assert run("approvals", "--db", url, cwd=tmp_path).stdout.startswith("no call awaits a decision")

    r = run("resume", "ses approve", "--db", url, *FAST, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "recovery execute" in r.stdout and "recovery deny" in r.stdout
    check_approval_demo(r.stdout, db, "ses approve")
    tr = load(db, "ses approve")
    coffee = tr.messages[1].tool_parts[0]
    assert coffee.state.input == {"item": "coffee", "quantity": 3}
    assert coffee.state.metadata["original_input"] == {"item": "coffee", "quantity": 2}
    assert [(o["item"], o["quantity"]) for o in ledger(db, "ses approve")] == [("coffee", 3)]
    again = run("resume", "ses approve", "--db", url, cwd=tmp_path)
    assert again.returncode == 0 and "nothing to resume" in again.stdout


@pytest.mark.crash
def test_kill_9_right_after_a_request_then_decide_and_resume(tmp_path):
    """SIGKILL right after the coffee order's request is written (the next call streams 0.25 s later):
    the request survives; approved from another process with corrected arguments, resumed, run once."""
    db = tmp_path / "k.db"
    env = dict(os.environ, PYTHONIOENCODING="utf-8", PYTHONUNBUFFERED="1")
    env.pop("WE0NB_DB", None)
    proc = subprocess.Popen([sys.executable, "-m", "we0nb.cli", "demo", "--approve", "--db", str(db), "--delay", "0.25"],
                            cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("  approval place_order") and '"coffee"' in line:
            proc.send_signal(signal.SIGKILL)
            break
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    sid = sid_of("".join(seen))
    before = load(db, sid)
    assert [p.state.input for p in before.pending_approvals] == [{"item": "coffee", "quantity": 2}]
    listed = run("approvals", "--db", str(db), cwd=tmp_path)
    assert listed.returncode == 0 and "1 call(s) await a decision" in listed.stdout
    call = before.pending_approvals[0].call_id
    ok = run("approve", sid, call, "--input", '{"item": "coffee", "quantity": 1}', "--db", str(db), cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    r = run("resume", sid, "--db", str(db), *FAST, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "recovery execute   place_order" in r.stdout and "with the corrected arguments" in r.stdout
    check_approval_demo(r.stdout, db, sid)
    assert [(o["item"], o["quantity"]) for o in ledger(db, sid)] == [("coffee", 1)]
    assert not load(db, sid).needs_resume


# --------------------------------------------------------------------------- errors, in one line


def test_every_bad_input_is_one_line_and_records_nothing(tmp_path):
    db = tmp_path / "e.db"
    url = str(db)
    assert run("demo", "--approve", "--no-resume", "--session", "ses_e", "--db", url, *FAST, cwd=tmp_path).returncode == 0
    ids = calls_of(db, "ses_e")
    stock = next(p.call_id for m in load(db, "ses_e").messages for p in m.tool_parts if p.tool == "check_stock")
    missing, empty = tmp_path / "missing.db", tmp_path / "empty.db"
    empty.write_bytes(b"")
    cases = [
        (("approvals", "--db", str(missing)), "no database at"),
        (("approvals", "--db", str(empty)), "no we0nb data in"),
        (("approve", "ses_e", ids["coffee"], "--db", str(missing)), "no database at"),
        (("deny", "ses_e", ids["coffee"], "--db", str(empty)), "no we0nb data in"),
        (("approve", "ses_nope", ids["coffee"], "--db", url), "no session 'ses_nope'"),
        (("approve", "ses_e", "call_nope", "--db", url), "has no call 'call_nope'; the calls that await a decision: "),
        (("deny", "ses_e", stock, "--db", url), "does not await a decision (it is pending; its tool needed no approval)"),
        (("approve", "ses_e", " ", "--db", url), "CALL must not be empty"),
        (("approve", "bad\tid", ids["coffee"], "--db", url), "printable"),
        (("approve", "ses_e", ids["coffee"], "--input", "{", "--db", url), "--input is not valid JSON"),
        (("approve", "ses_e", ids["coffee"], "--input", "[1]", "--db", url), "--input must be a JSON object"),
        (("approve", "ses_e", ids["coffee"], "--input", '{"item": "coffee", "quantity": "many"}', "--db", url),
         "Invalid arguments for tool 'place_order'"),
        (("approve", "ses_e", ids["coffee"], "--input", '{"item": "coffee"}', "--db", url), "quantity"),
        (("resume", "ses_e", "--db", url), "waits for a person's decision"),
        (("approvals", "--db", "mysql://u@h/db"), "SQLite or PostgreSQL"),
    ]
    for args, needle in cases:
        err = one_line_error(run(*args, cwd=tmp_path))
        assert len(err.strip().splitlines()) == 1, (args, err)
        assert needle in err, (args, err)
        assert "Nothing was recorded." in err or "--input" not in args or "JSON" in err
    assert not missing.exists() and empty.read_bytes() == b"", "a command created or wrote a database"
    assert [p.call_id for p in load(db, "ses_e").pending_approvals] == [ids["coffee"], ids["tea"]]  # nothing recorded
    # decided twice: the second one is refused, the first stands
    assert run("deny", "ses_e", ids["tea"], "--db", url, cwd=tmp_path).returncode == 0
    err = one_line_error(run("approve", "ses_e", ids["tea"], "--db", url, cwd=tmp_path))
    assert "was already denied; a decision is final" in err
    assert load(db, "ses_e").messages[1].tool_parts[2].approval == "denied"
    p = run("approve", "ses_e", "--db", url, cwd=tmp_path)
    assert p.returncode == 2 and "CALL" in p.stderr


def test_input_needs_a_schema_the_command_line_knows(tmp_path):
    db = tmp_path / "other.db"
    url = f"sqlite:///{db}"
    script = f"""
import asyncio
from we0nb import We0Agent, ScriptedModel, SqlPersistence, text, tool, tool_call, user_message
@tool(requires_approval=True)
def wire(to: str) -> str:
    return "wired"
async def main():
    p = SqlPersistence({url!r})
    agent = We0Agent(ScriptedModel([[tool_call("wire", {{"to": "x"}})]]), tools=[wire], persistence=p)
    r = await agent.invoke(session_id="ses_other", messages=[user_message("wire")])
    print(r.approvals[0].call_id)
    await p.close()
asyncio.run(main())
"""
    call = subprocess.run([sys.executable, "-c", script], check=True, timeout=60, capture_output=True,
                          text=True).stdout.strip()
    err = one_line_error(run("approve", "ses_other", call, "--input", '{"to": "y"}', "--db", url, cwd=tmp_path))
    assert "knows the schemas of the demo's tools only" in err and "agent.approve(" in err
    ok = run("approve", "ses_other", call, "--db", url, cwd=tmp_path)
    assert ok.returncode == 0 and "await agent.invoke(mode='resume', session_id='ses_other')" in ok.stdout
    assert load(db, "ses_other").messages[1].tool_parts[0].approval == "approved"


def test_a_run_holding_the_session_refuses_the_decision(tmp_path):
    db = tmp_path / "busy.db"
    assert run("demo", "--approve", "--no-resume", "--session", "ses_b", "--db", str(db), *FAST,
               cwd=tmp_path).returncode == 0
    ids = calls_of(db, "ses_b")
    holder = subprocess.Popen([sys.executable, "-c", f"""
import asyncio, sys
from we0nb import SqlPersistence
async def main():
    p = SqlPersistence({f'sqlite:///{db}'!r})
    lease = await p.acquire_lease("ses_b", "run_holder")
    print("held", flush=True)
    sys.stdin.readline()
    await lease.release()
    await p.close()
asyncio.run(main())
"""], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        err = one_line_error(run("approve", "ses_b", ids["coffee"], "--db", str(db), cwd=tmp_path))
        assert "is busy" in err
    finally:
        holder.communicate("\n", timeout=60)
    assert [p.call_id for p in load(db, "ses_b").pending_approvals] == [ids["coffee"], ids["tea"]]


def test_approvals_lists_every_session_and_help_names_the_commands(tmp_path, capsys):
    db = tmp_path / "two.db"
    for sid in ("ses_one", "ses_two"):
        assert cli(capsys, "demo", "--approve", "--no-resume", "--session", sid, "--db", str(db), *FAST)[0] == 0
    code, out, err = cli(capsys, "approvals", "--db", str(db))
    assert code == 0
    rows = [line for line in out.splitlines() if line.startswith("ses_")]
    assert [r.split()[0] for r in rows] == ["ses_one", "ses_one", "ses_two", "ses_two"]
    assert "4 call(s) await a decision" in out
    code, out, err = cli(capsys, "--help")
    for name in ("approvals", "approve", "deny"):
        assert name in out
        code, sub, _ = cli(capsys, name, "--help")
        assert code == 0 and f"usage: we0nb {name}" in sub and "--db" in sub


@pytest.mark.postgres
def test_approvals_never_creates_tables_on_postgres(tmp_path, pg_schema):
    scoped = f"{PG_URL}?options=-csearch_path%3D{pg_schema}"
    for args in (("approvals",), ("approve", "ses_x", "call_x"), ("deny", "ses_x", "call_x")):
        assert "no we0nb data in" in one_line_error(run(*args, "--db", scoped, cwd=tmp_path))
    assert pg_tables(pg_schema) == []
    # and on a PostgreSQL store the whole loop works
    assert run("demo", "--approve", "--no-resume", "--session", "ses_pg", "--db", scoped, *FAST,
               cwd=tmp_path).returncode == 0
    listed = run("approvals", "--db", scoped, cwd=tmp_path)
    assert listed.returncode == 0 and "2 call(s) await a decision" in listed.stdout
    calls = re.findall(r"^ses_pg\s+(call_\w+)\s+place_order\s+(\{.*?\})", listed.stdout, re.M)
    by_item = {json.loads(args)["item"]: cid for cid, args in calls}
    assert run("approve", "ses_pg", by_item["coffee"], "--db", scoped, cwd=tmp_path).returncode == 0
    assert run("deny", "ses_pg", by_item["tea"], "--db", scoped, cwd=tmp_path).returncode == 0
    r = run("resume", "ses_pg", "--db", scoped, *FAST, cwd=tmp_path)
    assert r.returncode == 0 and "OK: no order was placed twice." in r.stdout, r.stdout + r.stderr


def test_the_readme_approval_sample_is_what_the_demo_prints(tmp_path):
    """Every line of the docs' `we0nb demo --approve` sample (but the elided "...") is printed."""
    page = (Path(__file__).resolve().parent.parent / "docs" / "approval.md").read_text()
    section = page.split("## From the command line", 1)[1].split("\n## ", 1)[0]
    sample = next(body for lang, body in re.findall(r"```(\w*)\n(.*?)```", section, re.S) if not lang)
    p = run("demo", "--approve", cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    printed = p.stdout.splitlines()
    lines = [line for line in sample.splitlines() if line.strip() and line.strip() != "..."]
    assert len(lines) >= 8
    for line in lines:
        assert line in printed, line
