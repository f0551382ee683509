"""The demo's run, told from the store: the abort plan, the live lines, why recovery did what it
did, and the report checked against the ledger — shared by ``we0nb demo``, its ``--approve``
variant (:mod:`.demo_approval`) and ``we0nb resume`` (:mod:`.demo`).

The live lines are the run's events (each is sent after what it reports was persisted). Every
other sentence about the run is read back from the persisted transcript and from the ledger.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

from ..engine import We0Agent
from ..messages import ToolPart, Transcript
from ..persistence import Persistence
from ._common import EXIT_INTERRUPTED, CtrlC, hint, rule, say
from .demo_agent import ANCHOR, read_ledger
from .render import LivePrinter, call_label, format_tools, format_transcript

__all__ = ["AbortPlan", "stream_run", "print_store", "explainer", "explain_approval", "side_effects", "report",
           "stopped", "stop_before_resume", "resume_phase"]


class AbortPlan:
    """When the demo aborts its prompt run: ``after`` s into the tea order (:data:`.demo_agent.ANCHOR`:
    the ledger takes the order at once, its confirmation takes longer), or right after event ``at_event``."""

    def __init__(self, after: float, at_event: Optional[int]):
        self.after = after
        self.at_event = at_event
        self.fired: Optional[str] = None   # what set the abort, once it did
        self._timer: Optional[asyncio.TimerHandle] = None

    def describe(self) -> str:
        if self.at_event is not None:
            return f"the demo will abort it right after event {self.at_event}"
        return f"the demo will abort it {self.after:g} s after the tea order starts"

    def __call__(self, ev: Mapping[str, Any], n: int, abort: asyncio.Event) -> None:
        if self.at_event is not None:
            if n == self.at_event and not abort.is_set():
                abort.set()
                self.fired = f"the demo set the abort event right after event {n} ({ev['type']})"
            return
        part = ev.get("part")
        if (ev["type"] == "tool" and part is not None and (part.tool, part.state.input) == ANCHOR and part.state.status == "running"
                and self._timer is None):
            self._timer = asyncio.get_running_loop().call_later(self.after, self._fire, abort)

    def _fire(self, abort: asyncio.Event) -> None:
        if not abort.is_set():
            abort.set()
            self.fired = f"the demo set the abort event {self.after:g} s after the tea order started running"

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


async def stream_run(agent: We0Agent, ctrl: CtrlC, *, mode: str, session_id: str, messages: Any = None,
                  plan: Optional[AbortPlan] = None,
                  explain: Optional[Callable[[Mapping[str, Any]], str]] = None) -> bool:
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


def print_store(tr: Transcript) -> None:
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


def explainer(before: Transcript, agent: We0Agent) -> Callable[[Mapping[str, Any]], str]:
    """Why recovery took each action, from the tool's policy and the call's state before the resume."""
    was = {p.id: p.state.status for m in before.messages for p in m.tool_parts}
    stored = {p.id: p for m in before.messages for p in m.tool_parts}
    policies = {t.name: t.policy for t in agent.tools}
    interrupted_before = False

    def explain(ev: Mapping[str, Any]) -> str:
        nonlocal interrupted_before
        part, action = ev["part"], ev["action"]
        status = was.get(part.id, part.state.status)
        if action in ("execute", "deny", "await"):
            return explain_approval(action, stored.get(part.id, part))
        if action == "keep":
            return f"it had finished ({status}) before the abort: its result is kept, not run again"
        if action == "recall":
            if policies.get(part.tool) is not None and policies[part.tool].side_effects:
                return (f"idempotent (the ledger places one order per idempotency key) and {status} in the store: "
                        "run again with the same key")
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


def _orders_of(part: ToolPart, orders: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ledger lines of one call: those with its idempotency key (a line written before keys
    were: the same item and quantity)."""
    args = part.state.input
    return [o for o in orders if o.get("key") == part.idempotency_key
            or ("key" not in o and o.get("item") == args.get("item") and o.get("quantity") == args.get("quantity"))]


def _store_state(p: ToolPart) -> str:
    if p.interrupted:
        return f"interrupted ({p.interrupt_reason}): {p.effect}" if p.effect else f"interrupted ({p.interrupt_reason})"
    if p.approval == "denied" and p.finished:
        return "denied"
    return "awaiting approval" if p.awaiting_approval else p.state.status


def _call_effect(p: ToolPart, mine: list[dict[str, Any]]) -> tuple[bool, Optional[str]]:
    """Whether the ledger agrees with the store about one call, and what to say about it."""
    if len(mine) > 1:
        return False, None
    if p.interrupted and mine:
        if p.in_doubt is False:
            return False, "FAILED: the store says it never started, yet the ledger has an order for it"
        told = "; the model was told it may have run" if "may have run" in (getattr(p.state, "error", None) or "") else ""
        return True, ("it ran (the ledger has its order), but the process stopped before its result was persisted: "
                      f"the store says it may have run; resume did not run it again{told}")
    if p.interrupted and p.in_doubt:
        return True, "the store says it may have run; the ledger has no order for it: it had not reached the supplier"
    if p.approval == "denied" and mine:
        return False, "FAILED: a person denied it, yet the ledger has an order for it"
    if p.state.status == "completed" and not mine:
        return True, "the store says it completed but the ledger has no order for it (was the ledger edited?)"
    if p.recalled and mine:
        first = mine[0].get("attempt")
        if isinstance(first, int) and p.attempts > first:
            return True, (f"run again on resume (attempt {p.attempts}) with its idempotency key: the ledger already "
                          f"had that key from attempt {first} and did not place it again")
        return True, f"run again on resume (attempt {p.attempts}) with its idempotency key: placed once"
    return True, None


def side_effects(tr: Transcript, ledger: Path, session_id: str) -> tuple[bool, bool, bool]:
    """Each place_order call against the ledger: (some order was placed twice, the ledger and the
    store disagree about one, every order was placed exactly once — completed in the store and one
    line in the ledger)."""
    orders = read_ledger(ledger, session_id)
    twice, ok, exactly_once, calls = False, True, True, 0
    for m in tr.messages:
        for p in m.tool_parts:
            if p.tool != "place_order":
                continue
            calls += 1
            mine = _orders_of(p, orders)
            ids = ", ".join(o.get("order_id", "?") for o in mine)
            say(f"  {call_label(p)}: {_store_state(p)} in the store; {len(mine)} order(s) in the ledger"
                + (f" ({ids})" if ids else ""))
            agrees, note = _call_effect(p, mine)
            if note:
                say(f"    {note}")
            ok = ok and agrees
            twice = twice or len(mine) > 1
            exactly_once = exactly_once and p.state.status == "completed" and len(mine) == 1
    say(f"  ledger {ledger}: {len(orders)} order(s) for this session: "
        + (", ".join(f"{o.get('order_id')} {o.get('quantity')} x {o.get('item')}" for o in orders) or "none"))
    return twice, not ok, exactly_once and calls > 0


async def report(p: Persistence, session_id: str, url: str, ledger: Path) -> int:
    tr = await p.load_transcript(session_id)
    rule("3. the persisted transcript")
    say(format_transcript(tr))
    rule("4. tool calls: keep / recall / interrupt")
    say(format_tools(tr))
    rule("5. side effects, checked against the ledger")
    twice, disagree, exactly_once = side_effects(tr, ledger, session_id)
    if twice or disagree:
        say("FAILED: an order was placed more than once." if twice else
            "FAILED: the ledger has an order the store says never ran.")
        return 1
    if exactly_once:
        say("OK: every order was placed exactly once.")
    else:
        doubt = sum(1 for m in tr.messages for q in m.tool_parts if q.in_doubt)
        say("OK: no order was placed twice" + (" (the turn still needs resume)." if tr.needs_resume else ".")
            + (f" {doubt} call(s) may have run: the store cannot tell (see the ledger)." if doubt else ""))
    if url != "memory":
        say()
        say("Look again later:")
        say(f"  {hint('we0nb', 'sessions', '--db', url)}")
        say(f"  {hint('we0nb', 'show', session_id, '--db', url)}")
    return 0


def stopped(session_id: str, url: str, why: str) -> None:
    say()
    say(f"{why} Resume it, from this or any other process:")
    say(f"  {hint('we0nb', 'resume', session_id, '--db', url)}")


def stop_before_resume(ctrl: CtrlC, no_resume: bool, session_id: str, url: str) -> Optional[int]:
    """The exit code when the demo stops before resuming a cut turn (Ctrl-C, ``--no-resume``),
    after saying how to resume it; None when it goes on to the resume."""
    if ctrl.pressed:
        stopped(session_id, url, "Stopped by Ctrl-C.")
        return EXIT_INTERRUPTED
    if no_resume:
        stopped(session_id, url, "Stopped after the abort (--no-resume).")
        return 0
    return None


async def resume_phase(p: Persistence, agent: We0Agent, ctrl: CtrlC, session_id: str, url: str) -> Optional[int]:
    """The resume run; an exit code when it was aborted, None when it ended."""
    before = await p.load_transcript(session_id)
    ended = await stream_run(agent, ctrl, mode="resume", session_id=session_id, explain=explainer(before, agent))
    if ended:
        return None
    say(f"!! Aborted by {'Ctrl-C' if ctrl.pressed else 'an abort'}: the resume run stopped where it was.")
    say("What the store holds now:")
    print_store(await p.load_transcript(session_id))
    stopped(session_id, url, "Stopped by Ctrl-C." if ctrl.pressed else "Stopped by the abort.")
    return EXIT_INTERRUPTED


def explain_approval(action: str, before: Optional[object]) -> str:
    """Why recovery executed, denied or kept waiting a call, from the call as stored before the resume."""
    approval = getattr(before, "approval", None)
    detail = getattr(before, "approval_detail", None)
    status = getattr(getattr(before, "state", None), "status", "pending")
    if action == "execute":
        if approval == "approved":
            edited = " with the corrected arguments" if detail is not None and detail.input is not None else ""
            return f"a person approved it and it never started ({status}): it runs now{edited}, written running first"
        return f"it waited behind a call awaiting approval and never started ({status}): it runs now"
    if action == "deny":
        reason = f" ({detail.reason})" if detail is not None and detail.reason else ""
        return f"a person denied it{reason}: it never runs; the model is told"
    return "it still awaits a person's decision: nothing runs and the model is not called"
