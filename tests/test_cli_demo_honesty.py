"""Every claim the demo prints about a run matches the store and the ledger, wherever the abort,
a Ctrl-C or a ``kill -9`` lands.

The demo is aborted right after each of many events (``--abort-at-event N``), interrupted
with SIGINT and killed with SIGKILL at several points; then each printed claim is parsed
and checked against the persisted transcript (read with the typed API) and the ledger.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest

from we0nb import SqlPersistence, Transcript
from clikit import cli

FAST = ("--delay", "0")


# --------------------------------------------------------------------------- reading the truth


def load(db: Path, sid: str) -> Transcript:
    async def main() -> Transcript:
        p = SqlPersistence(f"sqlite:///{db}")
        try:
            return await p.load_transcript(sid)
        finally:
            await p.close()

    return asyncio.run(main())


def ledger(db: Path, sid: str) -> list[dict]:
    path = db.with_name(db.stem + ".orders.jsonl")
    if not path.exists():
        return []
    return [r for r in (json.loads(line) for line in path.read_text().splitlines() if line.strip())
            if r["session_id"] == sid]


def truth_rows(tr: Transcript) -> list[tuple[str, str, str, dict]]:
    """(tool, status, outcome, input) of every call, decided here from the typed API alone (the
    approval outcomes too, for `we0nb demo --approve`; a call that needed none never meets them)."""
    rows = []
    for m in tr.messages:
        closed = m.info.role == "assistant" and m.info.error is not None and m.info.error.reason == "UnfinishedAssistantMessage"
        for p in m.tool_parts:
            if p.interrupted:  # with what the store says of its effect (SPEC §11: in_doubt)
                doubt = p.state.metadata.get("in_doubt")
                effect = {True: ": may have run", False: ": never started"}.get(doubt, "") if isinstance(doubt, bool) else ""
                oc = f"interrupt ({p.interrupt_reason}){effect}"
            elif p.state.metadata.get("reconciled") is True:
                oc = "reconciled: completed on resume"
            elif p.recalled:
                oc = "recall"
            elif p.awaiting_approval:
                oc = "(awaiting approval)"
            elif p.approval == "denied":
                oc = "denied"
            elif p.approval == "approved":
                oc = "approved" if p.finished else "approved (not run yet)"
            elif not p.finished:
                oc = "(unfinished)"
            elif closed:
                oc = "keep"
            else:
                oc = "-"
            rows.append((p.tool, p.state.status, oc, p.state.input))
    return rows


# --------------------------------------------------------------------------- reading the claims


def _table(lines: list[str]) -> list[tuple[str, str, str, dict]]:
    rows = []
    for line in lines:
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) >= 5 and cells[0].isdigit():
            rows.append((cells[1], cells[2], cells[3], json.loads(cells[4])))
    return rows


def _block(out: list[str], start: int) -> list[str]:
    block = []
    for line in out[start + 1:]:
        if not line.strip() or line.startswith("==") or line.startswith("  the turn"):
            break
        block.append(line)
    return block


def claims(out: str) -> dict:
    lines = out.splitlines()
    c: dict = {"stores": [], "recovery": [], "final": None, "effects": [], "ok": None, "needs_resume": None}
    for i, line in enumerate(lines):
        if line.startswith("What the store holds now"):
            c["stores"].append(_table(_block(lines, i)))
        elif line.startswith("  the turn "):
            c["needs_resume"] = "needs resume" in line
        elif m := re.match(r"  recovery (keep|recall|interrupt)\s+(\w+)\((\{.*?\})\): (.*)$", line):
            c["recovery"].append((m[1], m[2], json.loads(m[3]), m[4]))
        elif line.startswith("== 4."):
            c["final"] = _table(_block(lines, i))
        elif m := re.match(r"  (place_order)\((\{.*?\})\): (.*) in the store; (\d+) order\(s\) in the ledger", line):
            c["effects"].append((json.loads(m[2]), m[3], int(m[4])))
        elif line.startswith("OK: ") or line.startswith("FAILED: "):
            c["ok"] = line.startswith("OK: ")
    return c


def check(out: str, db: Path, sid: str, *, before: Optional[Transcript] = None, stopped: bool = False) -> dict:
    """Assert every claim of ``out`` against the store; ``stopped``: the command ended without resuming."""
    c = claims(out)
    tr = load(db, sid)
    truth = truth_rows(tr)
    orders = ledger(db, sid)
    if stopped and c["stores"]:
        assert c["stores"][-1] == truth[:len(c["stores"][-1])], (c["stores"][-1], truth)  # a Ctrl-C may cut it
        assert c["needs_resume"] == tr.needs_resume
    first = truth_rows(before) if before else (c["stores"][0] if c["stores"] else [])
    pre = {json.dumps([t, i], sort_keys=True): s for t, s, _, i in first}
    final = {json.dumps([t, i], sort_keys=True): (s, oc) for t, s, oc, i in truth}
    interrupted = False
    # a resume aborted (Ctrl-C) after its decisions: the message is not closed yet, a recall may be running
    cut = "the resume run stopped where it was" in out
    for action, tool, args, why in c["recovery"]:
        key = json.dumps([tool, args], sort_keys=True)
        status, oc = final[key]
        allowed = {action} | ({"-"} if cut and action == "keep" else set()) | (
            {"(unfinished)"} if cut and action == "recall" else set())
        assert oc.split(" ")[0] in allowed, (action, tool, args, oc)
        was = pre.get(key)
        if was is not None:
            if action == "keep":
                assert f"had finished ({was})" in why
            elif action == "recall":
                assert f"and {was} in the store" in why
            else:
                assert ("never started (pending)" in why) == (was == "pending"), (why, was)
                assert ("started but never finished (running)" in why) == (was == "running"), (why, was)
        if action == "interrupt":
            assert ("it has side effects" in why) == (tool == "place_order"), why
            if tool == "check_stock":
                assert "after an interrupted call" in why and interrupted
            interrupted = True
    if c["final"] is not None:  # all of it, unless a Ctrl-C cut the printing
        assert c["final"] == truth[:len(c["final"])], (c["final"], truth)
    for args, state, n in c["effects"]:
        mine = [o for o in orders if o["item"] == args["item"] and o["quantity"] == args["quantity"]]
        assert n == len(mine)
        status, oc = final[json.dumps(["place_order", args], sort_keys=True)]
        assert state == (oc.replace("interrupt", "interrupted") if oc.startswith("interrupt") else status)
    if c["ok"] is not None:
        items = [(o["item"], o["quantity"]) for o in orders]
        assert c["ok"] == (len(items) == len(set(items)))
        assert c["ok"], "an order was placed twice"
    # the model's answer is made from its tool results: each order it names is in the ledger
    for m in tr.messages:
        for oid, q, item in re.findall(r"Order (ord-\d+) placed: (\d+) x (\w+)\.", m.text):
            assert any(o["order_id"] == oid and o["item"] == item and o["quantity"] == int(q) for o in orders)
        if "Tea: 14 in stock." in m.text:
            assert any(t == "check_stock" and s == "completed" for t, s, _, _ in truth)
    return c


# --------------------------------------------------------------------------- runs


def sid_of(out: str) -> str:
    return re.search(r"^  session   (\S+)$", out, re.M)[1]


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 14, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 30, 40, 60])
def test_abort_after_any_event_every_claim_matches_the_store(tmp_path, capsys, n):
    db = tmp_path / "d.db"
    code, out, err = cli(capsys, "demo", "--db", str(db), "--abort-at-event", str(n), *FAST)
    assert code == 0, out + err
    sid = sid_of(out)
    c = check(out, db, sid)
    if "The run finished before any abort" in out:
        assert not c["stores"] and not c["recovery"]
    else:
        assert c["stores"] and f"right after event {n} " in out
    assert c["ok"] is True
    # the same abort point, stopped there: the printed store is the store
    db2 = tmp_path / "s.db"
    code, out2, err = cli(capsys, "demo", "--db", str(db2), "--abort-at-event", str(n), "--no-resume", *FAST)
    assert code == 0, out2 + err
    check(out2, db2, sid_of(out2), stopped=True)


@pytest.mark.parametrize("after", ["0", "0.3", "0.59", "0.65", "5"])
def test_abort_timer_wherever_it_lands(tmp_path, capsys, after):
    db = tmp_path / "t.db"
    code, out, err = cli(capsys, "demo", "--db", str(db), "--abort-after", after, *FAST)
    assert code == 0, out + err
    c = check(out, db, sid_of(out))
    if after == "5":
        assert "The run finished before any abort: nothing was cut." in out and not c["recovery"]
        assert "did not complete" not in out


@pytest.mark.parametrize("n", [5, 8, 14, 20, 24, 28])
def test_at_most_once_abort_after_any_event_every_claim_matches_the_store(tmp_path, capsys, n):
    """The plain side-effect tool (``--at-most-once``): a cut order is interrupted, never run twice;
    the ledger never has an order the store says never started."""
    db = tmp_path / "a.db"
    code, out, err = cli(capsys, "demo", "--db", str(db), "--at-most-once", "--abort-at-event", str(n), *FAST)
    assert code == 0, out + err
    sid = sid_of(out)
    c = check(out, db, sid)
    assert c["ok"] is True
    tr, orders = load(db, sid), ledger(db, sid)
    for m in tr.messages:
        for p in m.tool_parts:
            if p.tool == "place_order" and p.interrupted and p.state.metadata.get("in_doubt") is False:
                assert not [o for o in orders if o["key"] == p.state.metadata["idempotency_key"]]


def _spawn(*args: str, cwd: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONIOENCODING="utf-8", PYTHONUNBUFFERED="1")
    env.pop("WE0NB_DB", None)
    return subprocess.Popen([sys.executable, "-m", "we0nb.cli", *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _run_until(proc: subprocess.Popen, marker: str, sig: int) -> tuple[str, str]:
    """Read the output until a line containing ``marker``, then send ``sig``; the whole output."""
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if marker in line:
            proc.send_signal(sig)
            break
    rest, err = proc.communicate(timeout=120)
    return "".join(seen) + rest, err


MARKS = ["  session ", "[user]", "tool place_order  running", "tool place_order  completed",
         "tool check_stock  running", "== 2.", "recovery recall", "tool check_stock  completed",
         "[assistant] step 1 of this run\n", "[finish]", "== 4."]


@pytest.mark.parametrize("mark", MARKS)
def test_ctrl_c_aborts_where_it_lands_and_the_claims_hold(tmp_path, mark):
    db = tmp_path / "c.db"
    proc = _spawn("demo", "--db", str(db), "--delay", "0.02", cwd=tmp_path)
    out, err = _run_until(proc, mark.rstrip("\n"), signal.SIGINT)
    assert "Traceback" not in err and "Traceback" not in out, err
    assert proc.returncode in (0, 130), (proc.returncode, out, err)
    sid = sid_of(out)
    if proc.returncode == 130:
        assert "Ctrl-C" in out + err
    if not db.exists() or load(db, sid).session is None:
        return  # stopped before the session was written: nothing was claimed about it
    # the store table printed before the resume section (== 2.) is only current if no resume began
    check(out, db, sid, stopped=proc.returncode == 130 and "== 2." not in out)
    tr = load(db, sid)
    if tr.needs_resume:
        assert "we0nb resume " + sid in out
        r = subprocess.run([sys.executable, "-m", "we0nb.cli", "resume", sid, "--db", str(db), *FAST],
                           cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        check(r.stdout, db, sid, before=tr)
        assert not load(db, sid).needs_resume


@pytest.mark.crash
@pytest.mark.parametrize("mark", MARKS[1:6])
def test_kill_9_then_resume_in_another_process(tmp_path, mark):
    db = tmp_path / "k.db"
    proc = _spawn("demo", "--db", str(db), "--delay", "0.02", cwd=tmp_path)
    out, err = _run_until(proc, mark, signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL
    sid = sid_of(out)
    before = load(db, sid)
    r = subprocess.run([sys.executable, "-m", "we0nb.cli", "resume", sid, "--db", str(db), *FAST],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout + r.stderr
    if before.needs_resume:
        c = check(r.stdout, db, sid, before=before)
        assert c["ok"] is True
    else:
        assert "nothing to resume" in r.stdout
    assert not load(db, sid).needs_resume


def test_a_duplicate_in_the_ledger_fails_the_check(tmp_path, capsys):
    """The final verdict is read from the ledger: a second order for one call makes it fail (exit 1)."""
    db = tmp_path / "dup.db"
    code, out, err = cli(capsys, "demo", "--db", str(db), "--no-resume", *FAST)
    assert code == 0, out + err
    sid = sid_of(out)
    path = db.with_name(db.stem + ".orders.jsonl")
    row = json.loads(path.read_text().splitlines()[0])
    path.write_text(path.read_text() + json.dumps({**row, "order_id": "ord-9999"}) + "\n")
    code, out, err = cli(capsys, "resume", sid, "--db", str(db), *FAST)
    assert code == 1
    assert "2 order(s) in the ledger (ord-0001, ord-9999)" in out and "FAILED: an order was placed more than once." in out
