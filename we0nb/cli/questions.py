"""``we0nb questions`` and ``we0nb answer``: a person answers, from a terminal, what an MCP
server asks while one of its tools runs (elicitation; see :mod:`we0nb.engine.questions`).

``questions`` lists the calls whose question awaits an answer, across the sessions of a
database (it only reads). ``answer SESSION CALL --content JSON`` (accept; the form's defaults
fill what is left out), ``--decline`` or ``--cancel`` answers one: the answer is checked
against the requested schema first (a mismatch is refused in one line and nothing is
recorded), then written into the stored call, where the run that waits reads it within half a
second. A question whose process has ended is refused: nobody waits for it any more.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..engine.questions import answer_question, awaiting_question, pending_questions
from ..engine.request import check_session_id
from ._common import CliError, CtrlC, hint, json_object, say
from ._db import normalize_db, open_store, safe_url
from .render import call_label, table

__all__ = ["cmd_questions", "cmd_answer", "add_parsers", "QUESTION_COLUMNS"]

QUESTION_COLUMNS = ("session", "call", "tool", "asks", "form", "asked")
_WIDTHS = {"session": 40, "call": 40, "asks": 48, "form": 60}


async def cmd_questions(args: argparse.Namespace, ctrl: CtrlC) -> int:
    url = normalize_db(args.db)
    p = open_store(url, read_only=True)
    try:
        rows: list[dict[str, Any]] = []
        for s in sorted(await p.list_sessions(), key=lambda s: s.time.created):
            for part in await pending_questions(p, s.id):
                q = awaiting_question(part) or {}
                form = json.dumps(q.get("schema", {}).get("properties", {}), ensure_ascii=False) \
                    if q.get("mode", "form") == "form" else f"open {q.get('url')}"
                rows.append({"session": s.id, "call": part.call_id, "tool": call_label(part, 40),
                             "asks": q.get("message", ""), "form": form, "asked": _when(q.get("asked"))})
        if not rows:
            say(f"no question awaits an answer in {safe_url(url)}")
            return 0
        say(table(rows, QUESTION_COLUMNS, _WIDTHS))
        first = rows[0]
        say(f"\n{len(rows)} question(s) await an answer in {safe_url(url)}; answer one:")
        say(f"  {hint('we0nb', 'answer', first['session'], first['call'], '--content', '{...}', '--db', url)}"
            "    # or --decline / --cancel")
        return 0
    finally:
        await p.close()


async def cmd_answer(args: argparse.Namespace, ctrl: CtrlC) -> int:
    url = normalize_db(args.db)
    session_id = check_session_id(args.session, "SESSION")
    action = "decline" if args.decline else "cancel" if args.cancel else "accept"
    content = _content(args.content) if args.content is not None else None
    if action != "accept" and content is not None:
        raise CliError(f"--{action} carries no answer: leave out --content.")
    p = open_store(url, read_only=True)
    try:
        try:
            q = await answer_question(p, session_id, args.call, action, content, by="cli")
        except ValueError as e:
            text = str(e).removeprefix("answer(): ")
            raise CliError(text if "nothing was sent" in text else f"{text} Nothing was sent or recorded.") from None
        what = f"accept {json.dumps(q.get('content'), ensure_ascii=False)}" if action == "accept" else action
        say(f"answered {q.get('message', '')!r} ({what}) for call {args.call} of session {session_id!r}: written "
            "into the stored call; the run that waits sends it to the server within a second.")
        return 0
    finally:
        await p.close()


def _content(text: str) -> dict[str, Any]:
    """``--content``: the form's fields, a JSON object."""
    return json_object(text, "--content", "the form's fields", '{"name": "tea"}', "Nothing was sent.")


def _when(t: Any) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC") \
        if isinstance(t, (int, float)) else ""


def add_parsers(sub: Any, db: argparse.ArgumentParser, common: argparse.ArgumentParser) -> dict[str, Any]:
    q = sub.add_parser("questions", parents=[db, common], help="list the questions MCP servers wait on a person for",
                       description="List the questions (MCP elicitations) that running tool calls wait on: "
                                   "session, call, tool, the question, the form's fields. Reads only.")
    q.set_defaults(run=cmd_questions)
    a = sub.add_parser("answer", parents=[db, common], help="answer a question a running call waits on",
                       description="Answer the question CALL of SESSION waits on: --content JSON accepts (checked "
                                   "against the requested schema, defaults filled in), --decline or --cancel. The "
                                   "waiting run reads the answer from the store and sends it to the server.")
    a.add_argument("session", metavar="SESSION", help="session id (see `we0nb questions`)")
    a.add_argument("call", metavar="CALL", help="call id (see `we0nb questions`)")
    how = a.add_mutually_exclusive_group()
    how.add_argument("--content", metavar="JSON", help="accept, with the form's fields as a JSON object")
    how.add_argument("--decline", action="store_true", help="decline (the server is told the person said no)")
    how.add_argument("--cancel", action="store_true", help="cancel (the person dismissed the question)")
    a.set_defaults(run=cmd_answer)
    return {"questions": q, "answer": a}
