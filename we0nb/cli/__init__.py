"""The ``we0nb`` command: a terminal demo of abort and resume, and a look into a session database.

::

    we0nb demo                  # demo agent on ./we0nb-demo.db: run, abort mid-tool, resume
    we0nb demo --no-resume      # stop after the abort; then, in a new process:
    we0nb resume SESSION        # resume it (the demo's tools and model)
    we0nb sessions              # list the sessions of the database
    we0nb show SESSION          # print a session's transcript and tool table
    we0nb demo --approve        # the demo's orders wait for a person's approval
    we0nb approvals             # list the tool calls that await a decision
    we0nb approve SESSION CALL  # approve one (--input JSON: corrected arguments); deny: --reason TEXT
    we0nb questions             # list the questions MCP servers wait on (elicitation); answer SES CALL --content JSON
    we0nb batch ls              # list the batches (agent.batch) of the database; batch show NAME
    we0nb fork SESSION          # copy a session (--at MESSAGE: up to a message) into a new one
    we0nb batch run M:A --prompts FILE --name NAME   # a batch worker (batch work M:A NAME: join one)
    we0nb lab                   # open the tutorial notebooks in JupyterLab

The commands that use a database take ``--db URL`` (a SQLAlchemy URL such as
``sqlite:///file.db`` or ``postgresql://…``, or a plain file path meaning SQLite); the
default is ``$WE0NB_DB`` or ``sqlite:///we0nb-demo.db``. Exit codes: 0 success, 1 an error
the one-line message explains, 2 bad command-line usage, 130 Ctrl-C. ``--debug`` shows
the traceback of an error.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
import traceback
from typing import Any, Optional, Sequence

from . import approvals, batch, browse, demo, fork, lab, questions
from ._common import EXIT_INTERRUPTED, CliError, CtrlC, safe_url
from ._db import DEFAULT_DB
from .demo_agent import DEMO_PROMPT, demo_agent

__all__ = ["main", "build_parser", "demo_agent", "DEMO_PROMPT"]


def _parsers() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    # (--help never shows a password; a % of a URL would be taken for argparse's formatting)
    default_db = safe_url(os.environ.get("WE0NB_DB", DEFAULT_DB)).replace("%", "%%")
    db = argparse.ArgumentParser(add_help=False)
    db.add_argument("--db", default=None,  # (None: $WE0NB_DB or DEFAULT_DB, read by normalize_db)
                    help="database: a SQLAlchemy URL (sqlite:///file.db, postgresql://user@host/db) or a SQLite "
                         f"file path (default: $WE0NB_DB or {DEFAULT_DB}, now {default_db})")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="on an error, show the traceback too")
    parser = argparse.ArgumentParser(
        prog="we0nb",
        description="we0nb: an asyncio agent engine whose resume never repeats a side effect.",
        epilog="Start with `we0nb demo`. demo, resume, sessions, show, approvals, approve, deny and fork take --db "
               "URL; lab passes the options it does not know to jupyter lab. `we0nb COMMAND -h` describes each "
               "command.")
    from .. import __version__

    parser.add_argument("--version", action="version", version=f"we0nb {__version__}")
    parser.add_argument("--debug", action="store_true", help="on an error, show the traceback too")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands: dict[str, argparse.ArgumentParser] = {}
    for module in (demo, browse, approvals, questions, batch, fork, lab):
        commands.update(module.add_parsers(sub, db, common))
    return parser, commands


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``we0nb`` command."""
    return _parsers()[0]


#: the float options with their largest value (a bigger one is a typo: the demo would wait for ever)
_SECONDS = {"delay": 60.0, "abort_after": 3600.0}


def _parse(argv: Optional[Sequence[str]]) -> tuple[argparse.Namespace, argparse.ArgumentParser]:
    parser, commands = _parsers()
    args, extra = parser.parse_known_args(argv)
    if args.command is None:
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        parser.print_help()
        raise SystemExit(2)
    # the parser of the command typed (`batch ls`, not `batch`): its usage goes with an error
    sub = commands.get(f"{args.command} {getattr(args, 'batch_command', None)}", commands[args.command])
    if args.command == "lab":
        args.jupyter_args = extra
    elif extra:
        sub.error(f"unrecognized arguments: {' '.join(extra)}")
    for name, most in _SECONDS.items():
        v = getattr(args, name, None)
        if v is not None and not (math.isfinite(v) and 0 <= v <= most):
            sub.error(f"--{name.replace('_', '-')} must be a number from 0 to {most:g} (seconds), got {v}")
    if getattr(args, "abort_at_event", None) is not None and args.abort_at_event < 1:
        sub.error("--abort-at-event must be 1 or more")
    return args, sub


async def _with_ctrl_c(fn: Any, args: argparse.Namespace) -> int:
    ctrl = CtrlC().install()
    try:
        return await fn(args, ctrl)
    finally:
        ctrl.uninstall()


def _first_lines(e: BaseException, n: int = 3) -> str:
    lines = [line for line in str(e).strip().splitlines() if line.strip()]
    return "\n".join(lines[:n]) if lines else type(e).__name__


def describe(e: BaseException) -> tuple[str, bool]:
    """The message for an error (at most a few lines), and whether it is unexpected (a bug)."""
    import sqlite3

    from sqlalchemy.exc import SQLAlchemyError

    from ..errors import We0Error

    if isinstance(e, (We0Error, ValueError, TypeError)):
        return _first_lines(e), False
    if isinstance(e, OSError):
        return f"{type(e).__name__}: {_first_lines(e, 1)}", False
    if isinstance(e, (SQLAlchemyError, sqlite3.Error)):
        orig = getattr(e, "orig", None) or e
        return f"the database cannot be used: {type(orig).__name__}: {_first_lines(orig, 1)}", False
    return f"unexpected {type(e).__name__}: {_first_lines(e, 1)} (a bug in we0nb: --debug shows the traceback)", True


def _fail(command: str, message: str) -> None:
    sys.stdout.flush()
    print(f"we0nb {command}: error: {message}", file=sys.stderr, flush=True)


def _silence_stdout() -> None:
    """stdout was closed (``we0nb sessions | head -1``): send the rest to /dev/null, quietly."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the ``we0nb`` command; returns the exit code (argparse exits itself on usage errors)."""
    try:
        args, _ = _parse(argv)
    except KeyboardInterrupt:
        print("we0nb: interrupted (Ctrl-C).", file=sys.stderr)
        return EXIT_INTERRUPTED
    command, debug = args.command, getattr(args, "debug", False)
    try:
        if asyncio.iscoroutinefunction(args.run):
            return asyncio.run(_with_ctrl_c(args.run, args))
        return args.run(args)
    except (KeyboardInterrupt, asyncio.CancelledError):
        _fail(command, "interrupted (Ctrl-C).")
        return EXIT_INTERRUPTED
    except CliError as e:
        _fail(command, str(e))
        return 1
    except BrokenPipeError:
        _silence_stdout()
        return 1
    except Exception as e:
        message, _bug = describe(e)
        _fail(command, message)
        if debug:
            traceback.print_exc()
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
