"""``we0nb demo`` and ``we0nb resume``: a run aborted mid-tool, then resumed, told from the store.

The live lines are the run's events (each is sent after what it reports was persisted).
Every other sentence about the run is read back from the persisted transcript and from
the ledger the side-effect tool writes: where the abort landed, what resume kept,
recalled or interrupted and why, and whether any order was placed twice. Ctrl-C is an
abort at whatever point it lands: the run stops there, the store is shown as it is, and
the command ends with exit code 130 and the line that resumes it.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any, Callable, Optional

from .._ids import new_id
from ..engine import We0Agent, user_message
from ..engine.request import check_session_id
from ..messages import Transcript
from ..persistence import Persistence
from ._common import EXIT_INTERRUPTED, CliError, CtrlC, hint, rule, say
from ._db import normalize_db, open_store, safe_url
from .demo_agent import DEMO_PROMPT, DEMO_TOOLS, demo_agent, ledger_path, read_ledger
from .render import LivePrinter, call_label, format_tools, format_transcript

__all__ = ["cmd_demo", "cmd_resume", "add_parsers"]


class AbortPlan:
    """When the demo aborts its prompt run: ``after`` s into check_stock, or right after event ``at_event``."""

    def __init__(self, after: float, at_event: Optional[int]):
        self.after = after
        self.at_event = at_event
        self.fired: Optional[str] = None   # what set the abort, once it did
        self._timer: Optional[asyncio.TimerHandle] = None

    def describe(self) -> str:
        if self.at_event is not None:
            return f"the demo will abort it right after event {self.at_event}"
        return f"the demo will abort it {self.after:g} s after check_stock starts"

    def __call__(self, ev: dict[str, Any], n: int, abort: asyncio.Event) -> None:
        if self.at_event is not None:
            if n == self.at_event and not abort.is_set():
                abort.set()
                self.fired = f"the demo set the abort event right after event {n} ({ev['type']})"
            return
        part = ev.get("part")
        if (ev["type"] == "tool" and part.tool == "check_stock" and part.state.status == "running"
                and self._timer is None):
            self._timer = asyncio.get_running_loop().call_later(self.after, self._fire, abort)

    def _fire(self, abort: asyncio.Event) -> None:
        if not abort.is_set():
            abort.set()
            self.fired = f"the demo set the abort event {self.after:g} s after check_stock started running"

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


async def _stream(agent: We0Agent, ctrl: CtrlC, *, mode: str, session_id: str, messages: Any = None,
                  plan: Optional[AbortPlan] = None,
                  explain: Optional[Callable[[dict[str, Any]], str]] = None) -> bool:
    """Print one run as it goes; True when it ended, False when it was aborted."""
    abort = asyncio.Event()
    show = LivePrinter(explain=explain)
    try:
        with ctrl.during(abort):
            async for ev in agent.stream(abort=abort, mode=mode, session_id=session_id, messages=messages):
                show(ev)
                if plan is not None:
                    plan(ev, show.events, abort)
    except asyncio.CancelledError:
        show.end()
        task = asyncio.current_task()
        if not abort.is_set() or (task is not None and task.cancelling()):
            raise  # the command itself was cancelled (a second Ctrl-C), not the run aborted
        return False
    finally:
        if plan is not None:
            plan.cancel()
    show.end()
    return True


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


def _print_store(tr: Transcript) -> None:
    last = tr.last_assistant
    if last is not None:
        done = last.info.time.completed is not None
        say(f"  last assistant message: {'finished' if done else 'unfinished (time.completed is None)'}")
    say(_indent(format_tools(tr)))
    if tr.pending_approvals:
        say(f"  the turn waits for a person's decision on {len(tr.pending_approvals)} call(s) before it can go on")
        return
    say("  the turn " + ("needs resume: resume decides for every unfinished call" if tr.needs_resume
                          else "is over in the store: there is nothing to resume"))


def _explainer(before: Transcript, agent: We0Agent) -> Callable[[dict[str, Any]], str]:
    """Why recovery took each action, from the tool's policy and the call's state before the resume."""
    was = {p.id: p.state.status for m in before.messages for p in m.tool_parts}
    stored = {p.id: p for m in before.messages for p in m.tool_parts}
    policies = {t.name: t.policy for t in agent.tools}
    interrupted_before = False

    def explain(ev: dict[str, Any]) -> str:
        nonlocal interrupted_before
        part, action = ev["part"], ev["action"]
        status = was.get(part.id, part.state.status)
        if action in ("execute", "deny", "await"):
            from .demo_approval import explain_approval

            return explain_approval(action, stored.get(part.id, part))
        if action == "keep":
            return f"it had finished ({status}) before the abort: its result is kept, not run again"
        if action == "recall":
            return f"read-only (side_effects=False) and {status} in the store: run again with its persisted input"
        policy = policies.get(part.tool)
        if policy is None:
            why = "its tool is not registered"
        elif policy.side_effects:
            why = "it has side effects"
        elif interrupted_before:
            why = "it comes after an interrupted call"
        else:
            why = "an earlier call's error blocks it"
        interrupted_before = True
        where = ("it never started (pending)" if status == "pending"
                 else "it started but never finished (running), so whether it took effect is unknown")
        return f"{why} and {where}: marked interrupted, not run again"

    return explain


def _side_effects(tr: Transcript, ledger: Path, session_id: str) -> bool:
    """Each place_order call against the ledger; True when none ran more than once."""
    orders = read_ledger(ledger, session_id)
    ok = True
    for m in tr.messages:
        for p in m.tool_parts:
            if p.tool != "place_order":
                continue
            args = p.state.input
            mine = [o for o in orders if o.get("item") == args.get("item") and o.get("quantity") == args.get("quantity")]
            state = (f"interrupted ({p.interrupt_reason})" if p.interrupted
                     else "denied" if p.approval == "denied" and p.finished
                     else "awaiting approval" if p.awaiting_approval else p.state.status)
            ids = ", ".join(o.get("order_id", "?") for o in mine)
            say(f"  {call_label(p)}: {state} in the store; {len(mine)} order(s) in the ledger"
                + (f" ({ids})" if ids else ""))
            if len(mine) > 1:
                ok = False
            elif p.interrupted and mine:
                say("    it ran, but the process stopped before its result was persisted; resume did not run it again")
            elif p.state.status == "completed" and not mine:
                say("    the store says it completed but the ledger has no order for it (was the ledger edited?)")
            elif p.approval == "denied" and mine:
                say("    FAILED: a person denied it, yet the ledger has an order for it")
                ok = False
    say(f"  ledger {ledger}: {len(orders)} order(s) for this session: "
        + (", ".join(f"{o.get('order_id')} {o.get('quantity')} x {o.get('item')}" for o in orders) or "none"))
    return ok


async def _report(p: Persistence, session_id: str, url: str, ledger: Path) -> int:
    tr = await p.load_transcript(session_id)
    rule("3. the persisted transcript")
    say(format_transcript(tr))
    rule("4. tool calls: keep / recall / interrupt")
    say(format_tools(tr))
    rule("5. side effects, checked against the ledger")
    if not _side_effects(tr, ledger, session_id):
        say("FAILED: an order was placed more than once.")
        return 1
    say("OK: no order was placed twice" + (" (the turn still needs resume)." if tr.needs_resume else "."))
    if url != "memory":
        say()
        say("Look again later:")
        say(f"  {hint('we0nb', 'sessions', '--db', url)}")
        say(f"  {hint('we0nb', 'show', session_id, '--db', url)}")
    return 0


def _stopped(session_id: str, url: str, why: str) -> None:
    say()
    say(f"{why} Resume it, from this or any other process:")
    say(f"  {hint('we0nb', 'resume', session_id, '--db', url)}")


def _stop_before_resume(ctrl: CtrlC, no_resume: bool, session_id: str, url: str) -> Optional[int]:
    """The exit code when the demo stops before resuming a cut turn (Ctrl-C, ``--no-resume``),
    after saying how to resume it; None when it goes on to the resume."""
    if ctrl.pressed:
        _stopped(session_id, url, "Stopped by Ctrl-C.")
        return EXIT_INTERRUPTED
    if no_resume:
        _stopped(session_id, url, "Stopped after the abort (--no-resume).")
        return 0
    return None


async def _resume_phase(p: Persistence, agent: We0Agent, ctrl: CtrlC, session_id: str, url: str) -> Optional[int]:
    """The resume run; an exit code when it was aborted, None when it ended."""
    before = await p.load_transcript(session_id)
    ended = await _stream(agent, ctrl, mode="resume", session_id=session_id, explain=_explainer(before, agent))
    if ended:
        return None
    say(f"!! Aborted by {'Ctrl-C' if ctrl.pressed else 'an abort'}: the resume run stopped where it was.")
    say("What the store holds now:")
    _print_store(await p.load_transcript(session_id))
    _stopped(session_id, url, "Stopped.")
    return EXIT_INTERRUPTED


async def cmd_demo(args: argparse.Namespace, ctrl: CtrlC) -> int:
    url = normalize_db(args.db)
    session_id = check_session_id(args.session, "--session") if args.session else new_id("ses")
    p = open_store(url, read_only=False)
    try:
        if await p.get_session(session_id) is not None:
            raise CliError(f"session {session_id!r} already exists in {safe_url(url)}; pick another --session "
                           f"or resume it with `{hint('we0nb', 'resume', session_id, '--db', url)}`.")
        ledger = ledger_path(url)
        agent = demo_agent(p, session_id, ledger, delay=args.delay, approve=args.approve)
        say(f"we0nb demo: a demo agent (no API key, no network) on {safe_url(url)}")
        say(f"  session   {session_id}")
        say("  tools     place_order (side effects: never run twice"
            + ("; requires_approval=True: a person approves every call)" if args.approve else ")"))
        say("            check_stock (side_effects=False: safe to run again)")
        say(f"  ledger    {ledger}  (place_order appends one line per order it really places)")
        if args.approve:
            from .demo_approval import approval_demo

            return await approval_demo(args, ctrl, p, agent, session_id, url, ledger)
        plan = AbortPlan(args.abort_after, args.abort_at_event)
        rule(f"1. prompt run; {plan.describe()} (Ctrl-C aborts it wherever it is)")
        ended = await _stream(agent, ctrl, mode="prompt", session_id=session_id,
                              messages=[user_message(DEMO_PROMPT)], plan=plan)
        tr = await p.load_transcript(session_id)
        if ended:
            say("The run finished before any abort: nothing was cut.")
        else:
            cause = plan.fired or ("Ctrl-C" if ctrl.pressed else "the abort event")
            say(f"!! Aborted: {cause}. The run stopped where it was and raised CancelledError.")
            say("What the store holds now (nothing was closed):")
            _print_store(tr)
        if not tr.needs_resume:
            return await _report(p, session_id, url, ledger)
        stop = _stop_before_resume(ctrl, args.no_resume, session_id, url)
        if stop is not None:
            return stop
        rule("2. resume: mode='resume', same session_id, a fresh abort event")
        code = await _resume_phase(p, agent, ctrl, session_id, url)
        return code if code is not None else await _report(p, session_id, url, ledger)
    finally:
        await p.close()


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
        tr = await p.load_transcript(session_id)
        if tr.session is None:
            raise CliError(f"no session {session_id!r} in {safe_url(url)}. List the sessions with "
                           f"`{hint('we0nb', 'sessions', '--db', url)}`.")
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
                f"    agent = We0Agent(model, tools=[...], persistence=SqlPersistence({url!r}))\n"
                f"    await agent.invoke(mode='resume', session_id={session_id!r})")
        ledger = ledger_path(url)
        approve = any(q.approval is not None for m in tr.messages for q in m.tool_parts)  # made with --approve
        agent = demo_agent(p, session_id, ledger, delay=args.delay, approve=approve)
        say(f"Resuming {session_id}: its last turn is not over in the store. With the demo's tools and model:")
        code = await _resume_phase(p, agent, ctrl, session_id, url)
        return code if code is not None else await _report(p, session_id, url, ledger)
    finally:
        await p.close()


def add_parsers(sub: Any, db: argparse.ArgumentParser, common: argparse.ArgumentParser) -> dict[str, Any]:
    d = sub.add_parser(
        "demo", parents=[db, common],
        help="run a demo agent, abort it mid-tool, resume it, and check the ledger",
        description="A demo agent (no API key, no network) with two tools - place_order (side effects: it "
                    "appends to a ledger file) and check_stock (read-only) - runs on a database and is aborted "
                    "while check_stock runs (or wherever Ctrl-C lands), then resumed. What the terminal says "
                    "about the run is read back from the store and the ledger: what resume kept, recalled "
                    "and interrupted, and whether any order was placed twice (exit code 1 if so). "
                    "Ctrl-C aborts the run where it is and exits with 130.")
    d.add_argument("--session", help="session id to create (default: a new ses_... id)")
    d.add_argument("--no-resume", action="store_true",
                   help="stop after the abort; resume later with `we0nb resume SESSION`")
    d.add_argument("--delay", type=float, default=0.03, help="seconds between streamed words (default 0.03)")
    d.add_argument("--abort-after", type=float, default=0.15, metavar="SECONDS",
                   help="abort this long after check_stock (0.6 s) starts (default 0.15)")
    d.add_argument("--abort-at-event", type=int, metavar="N",
                   help="abort right after the N-th event of the run instead (explore other abort points)")
    d.add_argument("--approve", action="store_true",
                   help="every place_order waits for a person's approval: the demo approves the coffee order, "
                        "denies the tea order with a reason, then resumes (with --no-resume it stops at the "
                        "request and prints the `we0nb approve` / `we0nb deny` / `we0nb resume` commands)")
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
