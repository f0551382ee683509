"""``we0nb fork SESSION [--at MESSAGE] [--as NEW]``: copy a session into a new one (SPEC §12).

The copy holds the session's visible messages up to and including MESSAGE (all of them without
``--at``); nothing is executed and no model is called. ``we0nb resume NEW`` (or any agent on the
database, with ``mode="resume"``) then runs the fork on. A database without we0nb data is
refused, never created.
"""

from __future__ import annotations

import argparse
from typing import Any, Optional

from ..engine.fork import fork_session
from ..engine.revert import visible_messages
from ..messages import Transcript
from ._common import CliError, CtrlC, check_name, hint, say
from ._db import load_session, normalize_db, open_store, safe_url

__all__ = ["add_parsers", "cmd_fork"]

#: the API's parameter names in fork's messages, as the flags typed (for what only fork_session sees: a race)
_FLAGS = {"fork(at=...)": "--at", "fork(new_session_id=...)": "--as", "fork(): ": "",
          " (see agent.transcript(session_id))": ""}


def _check_at(tr: Transcript, at: str, url: str) -> None:
    """``--at`` names a visible message of the session: else why not, and where its ids are listed."""
    assert tr.session is not None  # (load_session found it)
    sid = tr.session.id
    show = hint("we0nb", "show", sid, "--db", url)
    if at not in {m.info.id for m in tr.messages}:
        raise CliError(f"--at {at!r}: session {sid!r} has no such message; `{show}` lists its messages "
                       "(the msg_... ids). Nothing was written.")
    if at not in {m.info.id for m in visible_messages(tr.session, tr.messages)}:
        raise CliError(f"--at {at!r}: that message of session {sid!r} is hidden by a revert; fork at a visible "
                       f"one (`{show}`). Nothing was written.")


async def _check(p: Any, args: argparse.Namespace, url: str, session_id: str, new: Optional[str]) -> None:
    """What fork_session refuses, refused first in the command line's words (nothing written)."""
    try:
        tr = await load_session(p, url, session_id)
    except CliError as e:
        raise CliError(f"{e} Nothing was written.") from None
    if args.at is not None:
        _check_at(tr, args.at, url)
    if new is not None and await p.get_session(new) is not None:
        raise CliError(f"--as {new!r}: session {new!r} exists already in {safe_url(url)}; pass a new id (or "
                       "leave --as out: one is made). Nothing was written.")


def _in_flags(e: ValueError) -> str:
    message = str(e).strip().splitlines()[0]
    for api, flag in _FLAGS.items():
        message = message.replace(api, flag)
    return message


async def cmd_fork(args: argparse.Namespace, ctrl: CtrlC) -> int:
    url = normalize_db(args.db)
    session_id = check_name(args.session, "SESSION")
    new = check_name(args.new, "--as") if args.new is not None else None
    if new == session_id:
        raise CliError(f"--as {new!r} is the session being forked; pass a new id (or leave --as out: one is "
                       "made). Nothing was written.")
    p = open_store(url, read_only=True)
    try:
        await _check(p, args, url, session_id, new)
        try:
            new = await fork_session(p, session_id, at=args.at, new_session_id=new)
        except ValueError as e:
            raise CliError(f"{_in_flags(e)} Nothing was written.") from None
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
