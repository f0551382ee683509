"""``we0nb demo --approve``: the demo's orders wait for a person's approval, then resume.

Every ``place_order`` call requires approval: the prompt run ends with ``result ==
"approval"`` (check_stock waits behind the coffee order, so the order of the calls is
kept). The demo then decides as a person would — it approves the coffee order and denies
the others, with a reason — through the same ``decide`` as ``we0nb approve`` /
``we0nb deny``, prints each decision as the store holds it afterwards, and resumes: the
approved order runs once, check_stock runs, the model is told about the denial. With
``--no-resume`` it stops at the request and prints the commands that decide and resume.
Everything said about the run is read back from the store and the ledger, as in the demo.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..engine import We0Agent, user_message
from ..engine.approval import decide
from ..messages import Transcript
from ..persistence import Persistence
from ._common import EXIT_INTERRUPTED, CtrlC, hint, rule, say
from .demo_agent import DEMO_PROMPT
from .demo_run import AbortPlan, print_store, report, resume_phase, stop_before_resume, stream_run
from .render import call_label, ts

__all__ = ["approval_demo", "DENY_REASON", "APPROVED_ITEM"]

#: the demo's decisions: the coffee order is approved, any other order denied with this reason
APPROVED_ITEM = "coffee"
DENY_REASON = "no tea this week"


async def approval_demo(args: argparse.Namespace, ctrl: CtrlC, p: Persistence, agent: We0Agent, session_id: str,
                        url: str, ledger: Path) -> int:
    """The demo with ``--approve`` (the agent's place_order requires approval)."""

    plan = AbortPlan(args.abort_after, args.abort_at_event)
    first = ("place_order waits for a person's approval"
             + ("" if args.abort_at_event is None else f"; {plan.describe()}") + " (Ctrl-C aborts it wherever it is)")
    rule(f"1. prompt run; {first}")
    ended = await stream_run(agent, ctrl, mode="prompt", session_id=session_id, messages=[user_message(DEMO_PROMPT)],
                          plan=plan if args.abort_at_event is not None else None)
    tr = await p.load_transcript(session_id)
    if not ended:
        say(f"!! Aborted: {plan.fired or ('Ctrl-C' if ctrl.pressed else 'the abort event')}. The run stopped where "
            "it was and raised CancelledError.")
        say("What the store holds now (nothing was closed):")
        print_store(tr)
    for round_ in range(1, 4):  # a decision, and a resume that may stop at a request again
        if tr.pending_approvals:
            if ended:
                say("The run ended waiting for a person (result 'approval'): the calls below await a decision.")
            if ctrl.pressed or args.no_resume:
                return _stop_at_request(tr, session_id, url, ctrl)
            rule("2. approval: a person decides each awaiting call, then resume" if round_ == 1
                 else "2. approval again: the resume stopped at a request")
            await _decide(p, agent, tr, session_id)
            say("resume: mode='resume', same session_id, a fresh abort event")
        elif tr.needs_resume:
            stop = stop_before_resume(ctrl, args.no_resume, session_id, url)
            if stop is not None:
                return stop
            rule("2. resume: mode='resume', same session_id, a fresh abort event")
        else:
            break
        code = await resume_phase(p, agent, ctrl, session_id, url)
        if code is not None:
            return code
        tr = await p.load_transcript(session_id)
        ended = True
    return await report(p, session_id, url, ledger)


async def _decide(p: Persistence, agent: We0Agent, tr: Transcript, session_id: str) -> None:
    """Decide every awaiting call as the demo's person does, then say what the store holds."""
    waiting = tr.pending_approvals
    for part in waiting:
        why = part.approval_detail.why if part.approval_detail is not None else ""
        say(f"  awaiting  {call_label(part)}: {why}")
    say("  the demo decides as a person would, with the same call as `we0nb approve` / `we0nb deny`:")
    tools = agent.tools_by_name
    for part in waiting:
        approve = part.state.input.get("item") == APPROVED_ITEM
        await decide(p, tools, session_id, part.call_id, approve=approve, reason=None if approve else DENY_REASON)
    after = await p.load_transcript(session_id)
    stored = {q.call_id: q for m in after.messages for q in m.tool_parts}
    for part in waiting:
        q = stored[part.call_id]
        detail = q.approval_detail
        when = ts(detail.decided) if detail is not None else "-"
        reason = f" with reason {detail.reason!r}" if q.approval == "denied" and detail and detail.reason else ""
        say(f"  {q.approval or 'undecided':<9} {call_label(q)}{reason} (decided {when} UTC, read back from the store)")


def _stop_at_request(tr: Transcript, session_id: str, url: str, ctrl: CtrlC) -> int:
    """Stopped with calls awaiting a decision: the commands that decide them and resume."""
    say()
    say(("Stopped by Ctrl-C." if ctrl.pressed else "Stopped at the request (--no-resume).")
        + " Decide each call, from this or any other process, then resume:")
    for part in tr.pending_approvals:
        if part.state.input.get("item") == APPROVED_ITEM:
            words = ["we0nb", "approve", session_id, part.call_id, "--db", url]
        else:
            words = ["we0nb", "deny", session_id, part.call_id, "--reason", DENY_REASON, "--db", url]
        say(f"  {hint(*words)}    # {call_label(part)}")
    say(f"  {hint('we0nb', 'resume', session_id, '--db', url)}")
    say(f"(`{hint('we0nb', 'approvals', '--db', url)}` lists what awaits a decision.)")
    return EXIT_INTERRUPTED if ctrl.pressed else 0
