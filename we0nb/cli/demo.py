"""``we0nb demo`` and ``we0nb resume``: a run aborted mid-tool, then resumed, told from the store.

The live lines are the run's events (each is sent after what it reports was persisted).
Every other sentence about the run is read back from the persisted transcript and from
the ledger the side-effect tool writes: where the abort landed, what resume kept,
recalled or interrupted and why, and whether every order was placed exactly once (its
``place_order`` is idempotent against a ledger that places one order per key; with
``--at-most-once`` it is a plain side-effect tool, and the cut order ends in doubt). Ctrl-C is an
abort at whatever point it lands: the run stops there, the store is shown as it is, and
the command ends with exit code 130 and the line that resumes it.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from .._ids import new_id
from ..engine import user_message
from ..engine.request import check_session_id
from ..messages import Session, SessionTime, Transcript
from ._common import CliError, CtrlC, check_name, hint, rule, say
from ._db import load_session, normalize_db, open_store, safe_url
from .demo_agent import AT_MOST_ONCE_TITLE, DEMO_PROMPT, DEMO_TOOLS, demo_agent, ledger_path
from .demo_run import AbortPlan, print_store, report, resume_phase, stop_before_resume, stream_run

__all__ = ["cmd_demo", "cmd_resume", "add_parsers"]


async def cmd_demo(args: argparse.Namespace, ctrl: CtrlC) -> int:
    url = normalize_db(args.db)
    session_id = check_name(args.session, "--session") if args.session is not None else new_id("ses")
    p = open_store(url, read_only=False)
    try:
        if await p.get_session(session_id) is not None:
            raise CliError(f"session {session_id!r} already exists in {safe_url(url)}; pick another --session "
                           f"or resume it with `{hint('we0nb', 'resume', session_id, '--db', url)}`.")
        ledger = ledger_path(url)
        exactly_once = not args.at_most_once
        if not exactly_once:  # the session says which tool it had, for `we0nb resume`
            t = time.time()
            await p.upsert_session(Session(id=session_id, title=AT_MOST_ONCE_TITLE,
                                           time=SessionTime(created=t, updated=t)))
        agent = demo_agent(p, session_id, ledger, delay=args.delay, approve=args.approve, exactly_once=exactly_once)
        _header(url, session_id, ledger, args.approve, exactly_once)
        if args.approve:
            from .demo_approval import approval_demo

            return await approval_demo(args, ctrl, p, agent, session_id, url, ledger)
        plan = AbortPlan(args.abort_after, args.abort_at_event)
        rule(f"1. prompt run; {plan.describe()} (Ctrl-C aborts it wherever it is)")
        ended = await stream_run(agent, ctrl, mode="prompt", session_id=session_id,
                              messages=[user_message(DEMO_PROMPT)], plan=plan)
        tr = await p.load_transcript(session_id)
        if ended:
            say("The run finished before any abort: nothing was cut.")
        else:
            cause = plan.fired or ("Ctrl-C" if ctrl.pressed else "the abort event")
            say(f"!! Aborted: {cause}. The run stopped where it was and raised CancelledError.")
            say("What the store holds now (nothing was closed):")
            print_store(tr)
        if not tr.needs_resume:
            return await report(p, session_id, url, ledger)
        stop = stop_before_resume(ctrl, args.no_resume, session_id, url)
        if stop is not None:
            return stop
        rule("2. resume: mode='resume', same session_id, a fresh abort event")
        code = await resume_phase(p, agent, ctrl, session_id, url)
        return code if code is not None else await report(p, session_id, url, ledger)
    finally:
        await p.close()


def _header(url: str, session_id: str, ledger: Path, approve: bool, exactly_once: bool) -> None:
    say(f"we0nb demo: a demo agent (no API key, no network) on {safe_url(url)}")
    say(f"  session   {session_id}")
    if exactly_once:
        tool = ("place_order (side effects; idempotent=True: it sends its call's idempotency key, and the "
                "ledger places one order per key, so a resume may run it again")
    else:
        tool = "place_order (side effects, not idempotent (--at-most-once): never run twice"
    say(f"  tools     {tool}" + ("; requires_approval=True: a person approves every call)" if approve else ")"))
    say("            check_stock (side_effects=False: safe to run again)")
    say(f"  ledger    {ledger}  (one line per order the supplier really placed)")


def _is_demo_session(tr: Transcript) -> bool:
    first_user = next((m for m in tr.messages if m.info.role == "user"), None)
    if first_user is None or first_user.text != DEMO_PROMPT:
        return False
    return all(p.tool in DEMO_TOOLS for m in tr.messages for p in m.tool_parts)


async def cmd_resume(args: argparse.Namespace, ctrl: CtrlC) -> int:
    url = normalize_db(args.db)
    session_id = check_session_id(args.session, "SESSION")
    p = open_store(url, read_only=True)
    try:
        tr = await load_session(p, url, session_id)
        if tr.pending_approvals:
            calls = ", ".join(p.call_id for p in tr.pending_approvals)
            raise CliError(f"session {session_id!r} waits for a person's decision on {len(tr.pending_approvals)} "
                           f"call(s) ({calls}): decide each with `{hint('we0nb', 'approve', session_id, 'CALL', '--db', url)}`"
                           f" or `we0nb deny`, then resume (`{hint('we0nb', 'approvals', '--db', url)}` lists them).")
        if not tr.needs_resume:
            say(f"session {session_id} is complete: nothing to resume (a resume would call no model and "
                "write nothing).")
            return 0
        if not _is_demo_session(tr):
            raise CliError(
                f"session {session_id!r} was not written by `we0nb demo`, so the command line has no model "
                "or tools for it. Resume it from Python with the agent that ran it:\n"
                f"    agent = We0Agent(model, tools=[...], persistence=SqlPersistence({safe_url(url)!r}))\n"
                f"    await agent.invoke(mode='resume', session_id={session_id!r})")
        ledger = ledger_path(url)
        approve = any(q.approval is not None for m in tr.messages for q in m.tool_parts)  # made with --approve
        exactly_once = tr.session is None or tr.session.title != AT_MOST_ONCE_TITLE  # (--at-most-once)
        agent = demo_agent(p, session_id, ledger, delay=args.delay, approve=approve, exactly_once=exactly_once)
        say(f"Resuming {session_id}: its last turn is not over in the store. With the demo's tools and model:")
        code = await resume_phase(p, agent, ctrl, session_id, url)
        return code if code is not None else await report(p, session_id, url, ledger)
    finally:
        await p.close()


def add_parsers(sub: Any, db: argparse.ArgumentParser, common: argparse.ArgumentParser) -> dict[str, Any]:
    d = sub.add_parser(
        "demo", parents=[db, common],
        help="run a demo agent, abort it mid-tool, resume it, and check the ledger",
        description="A demo agent (no API key, no network) with two tools - place_order (side effects: it "
                    "appends to a ledger file) and check_stock (read-only) - runs on a database and is aborted "
                    "while the tea order runs in place_order (or wherever Ctrl-C lands), then resumed. What the "
                    "terminal says about the run is read back from the store and the ledger: what resume kept, recalled "
                    "and interrupted, and whether any order was placed twice (exit code 1 if so). "
                    "Ctrl-C aborts the run where it is and exits with 130.")
    d.add_argument("--session", help="session id to create (default: a new ses_... id)")
    d.add_argument("--no-resume", action="store_true",
                   help="stop after the abort; resume later with `we0nb resume SESSION`")
    d.add_argument("--delay", type=float, default=0.03, help="seconds between streamed words (default 0.03)")
    d.add_argument("--abort-after", type=float, default=0.15, metavar="SECONDS",
                   help="abort this long after the tea order starts (default 0.15: the ledger has taken the "
                        "order, its 0.5 s confirmation has not come back)")
    d.add_argument("--abort-at-event", type=int, metavar="N",
                   help="abort right after the N-th event of the run instead (explore other abort points)")
    d.add_argument("--approve", action="store_true",
                   help="every place_order waits for a person's approval: the demo approves the coffee order, "
                        "denies the tea order with a reason, then resumes (with --no-resume it stops at the "
                        "request and prints the `we0nb approve` / `we0nb deny` / `we0nb resume` commands)")
    d.add_argument("--at-most-once", action="store_true",
                   help="place_order is a plain side-effect tool (not idempotent), as before SPEC 11: the order "
                        "cut by the abort is interrupted on resume, in doubt, and the model is told it may have run")
    d.set_defaults(run=cmd_demo)

    r = sub.add_parser(
        "resume", parents=[db, common], help="resume an interrupted demo session (mode='resume')",
        description="Resume SESSION with mode='resume': recovery keeps finished tool calls, recalls read-only "
                    "ones, interrupts those with side effects, then the model continues. The command line only "
                    "has the demo's tools and model, so it resumes sessions made by `we0nb demo`; resume others "
                    "from Python with the agent that ran them. Ctrl-C aborts the resume where it is.")
    r.add_argument("session", metavar="SESSION", help="session id (see `we0nb sessions`)")
    r.add_argument("--delay", type=float, default=0.03, help="seconds between streamed words (default 0.03)")
    r.set_defaults(run=cmd_resume)
    return {"demo": d, "resume": r}
