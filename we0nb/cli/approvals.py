"""``we0nb approvals``, ``we0nb approve`` and ``we0nb deny``: a person's decisions from a terminal.

``approvals`` lists the calls that await a decision, across the sessions of a database
(it only reads). ``approve SESSION CALL [--input JSON]`` and ``deny SESSION CALL [--reason
TEXT]`` record one decision each, durable when the command returns (the same
``decide`` as ``agent.approve``/``agent.deny``: refused while a run holds the session, a
decision is final); ``we0nb resume SESSION`` then continues the turn. Nothing here creates
a database: a missing one, or one without we0nb data, is refused in one line.

``--input`` (corrected arguments) is checked against the tool's schema before anything is
recorded; the command line knows the schemas of the demo's tools only, so for other
sessions it approves the model's arguments as they are (correct them from Python).
"""

from __future__ import annotations

import argparse
import json
from typing import Any, Optional

from ..engine.approval import decide, pending_approvals
from ..engine.request import check_session_id
from ..messages import ToolPart, Transcript
from ..persistence import Persistence
from ._common import CliError, CtrlC, hint, json_object, say
from ._db import normalize_db, open_store, safe_url
from .demo_agent import demo_tools, ledger_path
from .render import approval_rows, call_label, table

__all__ = ["cmd_approvals", "cmd_approve", "cmd_deny", "add_parsers", "APPROVAL_COLUMNS"]

APPROVAL_COLUMNS = ("session", "call", "tool", "input", "why", "requested")
_WIDTHS = {"session": 40, "call": 40, "input": 40, "why": 48}


async def cmd_approvals(args: argparse.Namespace, ctrl: CtrlC) -> int:
    url = normalize_db(args.db)
    p = open_store(url, read_only=True)
    try:
        rows: list[dict[str, Any]] = []
        for s in sorted(await p.list_sessions(), key=lambda s: s.time.created):
            rows += approval_rows(s.id, await pending_approvals(p, s.id))
        if not rows:
            say(f"no call awaits a decision in {safe_url(url)}")
            return 0
        say(table(rows, APPROVAL_COLUMNS, _WIDTHS))
        say(f"\n{len(rows)} call(s) await a decision in {safe_url(url)}. Decide each one, then resume its session:")
        first = rows[0]
        say(f"  {hint('we0nb', 'approve', first['session'], first['call'], '--db', url)}"
            "    # --input JSON: corrected arguments")
        say(f"  {hint('we0nb', 'deny', first['session'], first['call'], '--db', url)}    # --reason TEXT: the model is told")
        say(f"  {hint('we0nb', 'resume', first['session'], '--db', url)}")
        return 0
    finally:
        await p.close()


async def cmd_approve(args: argparse.Namespace, ctrl: CtrlC) -> int:
    edited = _input(args.input) if args.input is not None else None
    return await _decide(args, approve=True, edited=edited, reason=None)


async def cmd_deny(args: argparse.Namespace, ctrl: CtrlC) -> int:
    return await _decide(args, approve=False, edited=None, reason=args.reason)


async def _decide(args: argparse.Namespace, *, approve: bool, edited: Optional[dict[str, Any]],
                  reason: Optional[str]) -> int:
    url = normalize_db(args.db)
    session_id = check_session_id(args.session, "SESSION")
    call_id = args.call
    if not call_id.strip():
        raise CliError("CALL must not be empty: pass the id of a call that awaits a decision (see `we0nb approvals`).")
    p = open_store(url, read_only=True)
    try:
        tr = await p.load_transcript(session_id)
        if tr.session is None:
            raise CliError(f"no session {session_id!r} in {safe_url(url)}. List the calls that await a decision "
                           f"with `{hint('we0nb', 'approvals', '--db', url)}`.")
        part = _awaiting(tr, session_id, call_id, url)
        tools: dict[str, Any] = {}
        if edited is not None:
            tools = _schemas(tr, part, url)
        try:
            decided = await decide(p, tools, session_id, call_id, approve=approve, input=edited, reason=reason)
        except ValueError as e:
            raise CliError(f"{_one_line(e)} Nothing was recorded.") from None
        _said(decided, session_id)
        await _next(p, tr, session_id, url)
        return 0
    finally:
        await p.close()


# --------------------------------------------------------------------------- checks


def _input(text: str) -> dict[str, Any]:
    """``--input``: the corrected arguments, a JSON object."""
    return json_object(text, "--input", "the corrected arguments", '{"item": "tea", "quantity": 1}')


def _awaiting(tr: Transcript, session_id: str, call_id: str, url: str) -> ToolPart:
    """The call ``call_id`` of the session if it awaits a decision; else why it cannot be decided."""
    for m in reversed(tr.messages):
        for part in m.tool_parts:
            if part.call_id != call_id:
                continue
            if part.awaiting_approval:
                return part
            if part.approval in ("approved", "denied") and not part.interrupted:
                raise CliError(f"call {call_id!r} of session {session_id!r} was already {part.approval}; "
                               "a decision is final.")
            state = f"interrupted ({part.interrupt_reason})" if part.interrupted else part.state.status
            raise CliError(f"call {call_id!r} of session {session_id!r} does not await a decision (it is {state}"
                           + ("" if part.approval else "; its tool needed no approval") + ").")
    waiting = ", ".join(p.call_id for p in tr.pending_approvals)
    raise CliError(f"session {session_id!r} has no call {call_id!r}; "
                   + (f"the calls that await a decision: {waiting}" if waiting else "none of its calls awaits a decision")
                   + f" (`{hint('we0nb', 'approvals', '--db', url)}`).")


def _schemas(tr: Transcript, part: ToolPart, url: str) -> dict[str, Any]:
    """The tool definitions ``--input`` is checked with: the demo's, for a session the demo wrote."""
    from .demo import _is_demo_session

    assert tr.session is not None  # (the caller found the call in this session)
    if not _is_demo_session(tr):
        raise CliError(f"--input: the command line knows the schemas of the demo's tools only, so it cannot check "
                       f"corrected arguments for {part.tool!r} in a session `we0nb demo` did not write. Approve the "
                       "model's arguments without --input, or correct them from Python with the agent: "
                       f"await agent.approve({tr.session.id!r}, {part.call_id!r}, input={{...}}).")
    return {t.name: t for t in demo_tools(ledger_path(url), tr.session.id)}


def _one_line(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).splitlines()
             if line.strip() and not line.strip().startswith("For further information")]
    return "; ".join(lines).removeprefix("approve(input=...): ")


# --------------------------------------------------------------------------- what is said


def _said(part: ToolPart, session_id: str) -> None:
    detail = part.approval_detail
    if part.approval == "approved":
        extra = (f"; corrected arguments {json.dumps(detail.input, ensure_ascii=False)} will run instead of the "
                 f"model's {json.dumps(detail.original_input, ensure_ascii=False)}"
                 if detail is not None and detail.input is not None else "")
        say(f"approved {call_label(part)}, call {part.call_id} of session {session_id!r}: recorded in the store{extra}.")
    else:
        why = f" (reason: {detail.reason})" if detail is not None and detail.reason else " (no reason given)"
        say(f"denied {call_label(part)}, call {part.call_id} of session {session_id!r}{why}: recorded in the store; "
            "it never runs and the model is told.")


async def _next(p: Persistence, tr: Transcript, session_id: str, url: str) -> None:
    """What is left: the session's other awaiting calls, or how to continue the turn."""
    from .demo import _is_demo_session

    left = await pending_approvals(p, session_id)
    if left:
        say(f"{len(left)} call(s) of this session still await a decision:")
        say(table(approval_rows(session_id, left), APPROVAL_COLUMNS[1:], _WIDTHS))
        return
    if _is_demo_session(tr):
        say(f"No call of this session awaits a decision now; continue the turn: "
            f"{hint('we0nb', 'resume', session_id, '--db', url)}")
    else:
        say("No call of this session awaits a decision now; continue the turn from Python with the agent that ran "
            f"it: await agent.invoke(mode='resume', session_id={session_id!r})")


def add_parsers(sub: Any, db: argparse.ArgumentParser, common: argparse.ArgumentParser) -> dict[str, Any]:
    a = sub.add_parser("approvals", parents=[db, common], help="list the tool calls that await a person's decision",
                       description="List the tool calls that await a person's approval, in every session of the "
                                   "database: session, call id, tool, arguments, why, when it was asked. Reads "
                                   "only: a database without we0nb data is refused, never created.")
    a.set_defaults(run=cmd_approvals)
    ap = sub.add_parser("approve", parents=[db, common], help="approve a call that awaits a decision",
                        description="Approve CALL of SESSION (durable when the command returns; a decision is "
                                    "final). `we0nb resume SESSION` then runs it. Refused while a run holds the "
                                    "session.")
    ap.add_argument("session", metavar="SESSION", help="session id (see `we0nb approvals`)")
    ap.add_argument("call", metavar="CALL", help="call id (see `we0nb approvals`)")
    ap.add_argument("--input", metavar="JSON",
                    help="corrected arguments, a JSON object, checked against the tool's schema before anything is "
                         "recorded (the demo's tools); the model's own are kept")
    ap.set_defaults(run=cmd_approve)
    d = sub.add_parser("deny", parents=[db, common], help="deny a call that awaits a decision",
                       description="Deny CALL of SESSION (durable when the command returns; a decision is final): "
                                   "it never runs; on `we0nb resume SESSION` the model is told, with the reason.")
    d.add_argument("session", metavar="SESSION", help="session id (see `we0nb approvals`)")
    d.add_argument("call", metavar="CALL", help="call id (see `we0nb approvals`)")
    d.add_argument("--reason", metavar="TEXT", help="why (the model is told)")
    d.set_defaults(run=cmd_deny)
    return {"approvals": a, "approve": ap, "deny": d}
