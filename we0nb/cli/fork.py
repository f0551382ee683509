"""``we0nb fork SESSION [--at MESSAGE] [--as NEW]``: copy a session into a new one (SPEC §12).

The copy holds the session's visible messages up to and including MESSAGE (all of them without
``--at``); nothing is executed and no model is called. ``we0nb resume NEW`` (or any agent on the
database, with ``mode="resume"``) then runs the fork on. A database without we0nb data is
refused, never created.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..engine.fork import fork_session
from ..engine.request import check_session_id
from ._common import CliError, CtrlC, hint, say
from ._db import normalize_db, open_store

__all__ = ["add_parsers", "cmd_fork"]


async def cmd_fork(args: argparse.Namespace, ctrl: CtrlC) -> int:
    url = normalize_db(args.db)
    session_id = check_session_id(args.session, "SESSION")
    p = open_store(url, read_only=True)
    try:
        try:
            new = await fork_session(p, session_id, at=args.at, new_session_id=args.new)
        except ValueError as e:
            raise CliError(f"{str(e).strip().splitlines()[0]} Nothing was written.") from None
        tr = await p.load_transcript(new)
        where = f"at message {args.at}" if args.at else "with its whole history"
        say(f"forked {session_id} {where} into {new} ({len(tr.messages)} message(s)); nothing was run.")
        if tr.needs_resume:
            say(f"continue it: {hint('we0nb', 'resume', new, '--db', url)}  (or mode=\"resume\" with any agent)")
        else:
            say(f"ask it something new with mode=\"prompt\" (session_id={new!r}); see it: "
                f"{hint('we0nb', 'show', new, '--db', url)}")
        return 0
    finally:
        await p.close()


def add_parsers(sub: Any, db: argparse.ArgumentParser, common: argparse.ArgumentParser) -> dict[str, Any]:
    f = sub.add_parser("fork", parents=[db, common], help="copy a session up to a message into a new session",
                       description="Copy SESSION's visible messages, up to and including MESSAGE (--at; default: all), "
                                   "into a new session, executing nothing: unfinished tool calls end interrupted "
                                   "(reason 'fork'). Prints the new session's id; `we0nb resume NEW` runs it on.")
    f.add_argument("session", metavar="SESSION", help="the session to fork (see `we0nb sessions`)")
    f.add_argument("--at", metavar="MESSAGE", default=None,
                   help="the last message to copy (a message id, see `we0nb show SESSION`)")
    f.add_argument("--as", dest="new", metavar="NEW", default=None, help="the new session's id (default: a new one)")
    f.set_defaults(run=cmd_fork)
    return {"fork": f}
