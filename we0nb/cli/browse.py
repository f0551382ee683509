"""``we0nb sessions`` and ``we0nb show``: read what a database holds, never write to it."""

from __future__ import annotations

import argparse
from typing import Any

from ..engine.request import check_session_id
from ._common import CtrlC, say
from ._db import load_session, normalize_db, open_store, safe_url
from .render import ts, format_tools, format_transcript, session_cost, session_state, table

__all__ = ["cmd_sessions", "cmd_show", "add_parsers"]


async def cmd_sessions(args: argparse.Namespace, ctrl: CtrlC) -> int:
    url = normalize_db(args.db)
    p = open_store(url, read_only=True)
    try:
        sessions = await p.list_sessions()
        if not sessions:
            say(f"no sessions in {safe_url(url)}")
            return 0
        rows = []
        for s in sorted(sessions, key=lambda s: s.time.created):
            tr = await p.load_transcript(s.id)
            rows.append({"session": s.id, "updated": ts(s.time.updated), "messages": str(len(tr.messages)),
                         "tools": str(sum(len(m.tool_parts) for m in tr.messages)),
                         "state": session_state(tr), "title": s.title})
        say(table(rows, ("session", "updated", "messages", "tools", "state", "title"), {"title": 40}))
        say(f"\n{len(rows)} session(s) in {safe_url(url)}")
        return 0
    finally:
        await p.close()


async def cmd_show(args: argparse.Namespace, ctrl: CtrlC) -> int:
    url = normalize_db(args.db)
    session_id = check_session_id(args.session, "SESSION")
    p = open_store(url, read_only=True)
    try:
        tr = await load_session(p, url, session_id)
        say(format_transcript(tr))
        say()
        say("tool calls:")
        say(format_tools(tr))
        say(f"\nstate: {session_state(tr)}")
        if any(m.info.role == "assistant" for m in tr.messages):
            say(f"cost: {session_cost(tr)}")
        return 0
    finally:
        await p.close()


def add_parsers(sub: Any, db: argparse.ArgumentParser, common: argparse.ArgumentParser) -> dict[str, Any]:
    s = sub.add_parser("sessions", parents=[db, common], help="list the sessions of a database",
                       description="List every session: id, last update, message and tool-call counts, and "
                                   "whether it is complete or needs a resume. Reads only: a database without "
                                   "we0nb data is refused, never created.")
    s.set_defaults(run=cmd_sessions)
    sh = sub.add_parser("show", parents=[db, common], help="print a session's transcript and tool table",
                        description="Print the persisted transcript of SESSION and a table of its tool calls "
                                    "with their keep / recall / interrupt outcome. Reads only.")
    sh.add_argument("session", metavar="SESSION", help="session id (see `we0nb sessions`)")
    sh.set_defaults(run=cmd_show)
    return {"sessions": s, "show": sh}
