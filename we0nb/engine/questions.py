"""What a running call tells its run while it runs: progress (shown live) and questions for a
person (an MCP server's elicitation), which are durable like an approval.

A tool that reports updates (``ToolDefinition.reports_updates``: MCP tools) runs in a task of
its own while the run's task watches it (:meth:`CallUpdates.watch`): each change becomes one
``tool`` event with the running part (progress coalesced to at most one event per
:data:`PROGRESS_EVERY` seconds), and an abort still cancels the call at once.

A question (``await updates.ask(question)``) is written into the running call's
``state.metadata["questions"]`` — durable before anyone can answer it — and the run waits for
the answer, as it waits for the tool. It is answered from this process (``We0Agent.answer``,
the notebook's panel: at once) or from another one (``we0nb answer`` on the same database: the
answer is written into the stored call, which the waiting run reads every
:data:`POLL_EVERY` seconds). An answer is checked against the requested schema first: one that
does not match raises ``ValueError`` and nothing is sent or recorded. If the process ends
before the answer, the server's request ends with it: the call is ``running`` in the store and
resume interrupts it (its question kept, ``status: "unanswered"``), as for any call cut off.

A stored question: ``id``, ``mode`` (``"form"``/``"url"``), ``source`` (who asks), ``message``,
``schema`` (form) or ``url``, ``asked``; ``status`` is ``"awaiting"``, then the action
(``"accept"``, ``"decline"``, ``"cancel"``) with ``content`` (an accepted form, defaults
applied), ``answered`` and ``by``; or ``"unanswered"`` when the call ended first.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Mapping, Optional

from .._forms import check_form_answer
from .._ids import new_id, now
from ..errors import SessionBusyError
from ..messages import ToolPart, ToolStateRunning, snapshot
from ..persistence.base import Persistence
from .request import check_session_id

__all__ = ["CallUpdates", "ACTIONS", "pending_questions", "answer_question", "awaiting_question",
           "unanswered"]

log = logging.getLogger("we0nb")

ACTIONS = ("accept", "decline", "cancel")
#: at most one progress event per this many seconds (a flood of notifications is coalesced)
PROGRESS_EVERY = 0.05
#: how often a run waiting for an answer reads the store (an answer from another process)
POLL_EVERY = 0.5

#: the calls of this process that wait for an answer: (session_id, call_id) -> their updates
_LIVE: dict[tuple[str, str], "CallUpdates"] = {}


class CallUpdates:
    """The channel between one running call and its run (see the module docstring)."""

    def __init__(self, part: ToolPart, meta: dict[str, Any], store: Persistence, writer: Any) -> None:
        self.part = part
        self.meta = meta  # what the call's final state keeps (its questions, with their answers)
        self.store = store
        self.writer = writer
        self._progress: Optional[dict[str, Any]] = None
        self._shown_at = 0.0
        self._polled_at = 0.0
        self._dirty: set[str] = set()  # "progress", "question", "answer"
        self._wake: Optional[asyncio.Future[None]] = None
        self._asks: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self.questions: list[dict[str, Any]] = []

    # ---------------------------------------------------------------- the tool's side

    def progress(self, data: Mapping[str, Any]) -> None:
        """The call's progress now (cheap: a flood costs one event per PROGRESS_EVERY)."""
        self._progress = dict(data)
        self._dirty.add("progress")
        self.poke()

    async def ask(self, question: Mapping[str, Any]) -> dict[str, Any]:
        """Ask a person; the answer ``{"action": ..., "content": ...}`` once given (checked)."""
        record = {"id": new_id("ask"), **dict(question), "asked": now(), "status": "awaiting"}
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._asks[record["id"]] = fut
        self.questions.append(record)
        self._dirty.add("question")
        self.poke()
        try:
            return await fut
        finally:
            self._asks.pop(record["id"], None)

    # ---------------------------------------------------------------- a person's side

    def awaiting(self) -> Optional[dict[str, Any]]:
        return next((q for q in reversed(self.questions) if q["status"] == "awaiting"), None)

    def answer(self, action: str, content: Optional[Mapping[str, Any]], by: str) -> dict[str, Any]:
        """Give the awaiting question its answer (ValueError, nothing recorded: it does not fit)."""
        q = self.awaiting()
        fut = self._asks.get(q["id"]) if q is not None else None
        if q is None or fut is None or fut.done():
            raise ValueError(f"call {self.part.call_id!r} has no question awaiting an answer.")
        filled = checked(q, action, content)
        q.update({"status": action, "answered": now(), "by": by}, **({"content": filled} if filled is not None else {}))
        fut.set_result({"action": action, "content": filled})
        self._dirty.add("answer")
        self.poke()
        return dict(q)

    # ---------------------------------------------------------------- the run's side

    async def watch(self, job: "asyncio.Future[Any]") -> bool:
        """Wait for ``job`` to end (False) or for something to show (True, see :meth:`take`); while a
        question awaits, read the store for an answer every POLL_EVERY seconds. (``job`` has
        :meth:`poke` as a done callback.)"""
        loop = asyncio.get_running_loop()
        while not job.done():
            if self._due(loop.time()):
                return True
            wake = self._wake = loop.create_future()
            delay = None
            if "progress" in self._dirty:
                delay = max(0.0, self._shown_at + PROGRESS_EVERY - loop.time())
            if self.awaiting() is not None:
                delay = POLL_EVERY if delay is None else min(delay, POLL_EVERY)
            try:
                if delay is None:
                    await wake  # (a fresh future each time: cancelling it with the run loses nothing)
                else:
                    await asyncio.wait_for(wake, delay)
            except asyncio.TimeoutError:
                pass
            finally:
                self._wake = None
            if self.awaiting() is not None and loop.time() >= self._polled_at + POLL_EVERY:
                self._polled_at = loop.time()
                await self._poll()
        return False

    async def take(self) -> None:
        """Put what changed into the running part (a question or an answer: durably written)."""
        durable = bool(self._dirty & {"question", "answer"})
        self._dirty.clear()
        self._shown_at = asyncio.get_running_loop().time()
        if self.questions:
            self.meta["questions"] = [dict(q) for q in self.questions]
        state = self.part.state
        assert isinstance(state, ToolStateRunning)
        extra: dict[str, Any] = {"progress": self._progress} if self._progress is not None else {}
        if self.questions:
            extra["questions"] = [dict(q) for q in self.questions]
        self.part.state = ToolStateRunning(input=state.input, time=state.time, metadata={**state.metadata, **extra})
        if durable:
            await self.writer.write(None, self.part)
            key = (self.part.session_id, self.part.call_id)
            if self.awaiting() is not None:
                _LIVE[key] = self
            elif _LIVE.get(key) is self:
                del _LIVE[key]

    def close(self) -> None:
        """The call ended: questions still awaiting are unanswered (their waiters get ``cancel``)."""
        key = (self.part.session_id, self.part.call_id)
        if _LIVE.get(key) is self:
            del _LIVE[key]
        for q in self.questions:
            if q["status"] == "awaiting":
                q["status"] = "unanswered"
        for fut in self._asks.values():
            if not fut.done():
                fut.set_result({"action": "cancel", "content": None})
        if self.questions:
            self.meta["questions"] = [dict(q) for q in self.questions]

    def _due(self, t: float) -> bool:
        if self._dirty & {"question", "answer"}:
            return True
        return "progress" in self._dirty and t >= self._shown_at + PROGRESS_EVERY

    def poke(self, *_: Any) -> None:
        """Wake the run's :meth:`watch` (also the job's done callback)."""
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    async def _poll(self) -> None:
        """An answer written by another process into the stored call (``we0nb answer``)."""
        q = self.awaiting()
        if q is None:
            return
        try:
            stored = _find_part(await self.store.load_recent(self.part.session_id), self.part.call_id)
        except Exception as e:  # the store is down for a moment: the next poll tries again
            log.warning("could not read the answer to question %s from the store: %s", q["id"], e)
            return
        if stored is None:
            return
        theirs = next((s for s in stored.state.metadata.get("questions") or () if s.get("id") == q["id"]), None)
        if theirs is None or theirs.get("status") not in ACTIONS:
            return
        fut = self._asks.get(q["id"])
        q.update({k: theirs[k] for k in ("status", "content", "answered", "by") if k in theirs})
        if fut is not None and not fut.done():
            fut.set_result({"action": theirs["status"], "content": theirs.get("content")})
        self._dirty.add("answer")


def checked(question: Mapping[str, Any], action: Any, content: Optional[Mapping[str, Any]]) -> Optional[dict[str, Any]]:
    """The content to send for ``action`` (a form's, defaults applied; else None), or ValueError why not."""
    if action not in ACTIONS:
        raise ValueError(f"answer(action=...): expected 'accept', 'decline' or 'cancel', got {action!r}.")
    if action != "accept":
        if content is not None:
            raise ValueError(f"answer(): a {action} carries no content; leave content out.")
        return None
    if question.get("mode", "form") != "form":
        return None
    try:
        return check_form_answer(question.get("schema") or {}, content)
    except ValueError as e:
        raise ValueError(f"answer(): {e}; nothing was sent or recorded.") from None


def awaiting_question(part: ToolPart) -> Optional[dict[str, Any]]:
    """The stored question ``part`` waits on (its running state's last awaiting one), or None."""
    if not isinstance(part.state, ToolStateRunning):
        return None
    qs = part.state.metadata.get("questions") or ()
    return next((dict(q) for q in reversed(qs) if isinstance(q, Mapping) and q.get("status") == "awaiting"), None)


def unanswered(metadata: Mapping[str, Any]) -> Optional[list[dict[str, Any]]]:
    """The questions of a running call cut off (awaiting ones become ``unanswered``), for its final state."""
    qs = metadata.get("questions")
    if not qs:
        return None
    return [{**q, "status": "unanswered"} if q.get("status") == "awaiting" else dict(q) for q in qs]


async def pending_questions(p: Persistence, session_id: str) -> list[ToolPart]:
    """The running calls of ``session_id`` whose question awaits an answer, in call order."""
    check_session_id(session_id)
    recent = await p.load_recent(session_id)
    return [snapshot(part) for m in recent.messages for part in m.tool_parts if awaiting_question(part) is not None]


async def answer_question(p: Persistence, session_id: str, call_id: str, action: str = "accept",
                          content: Optional[Mapping[str, Any]] = None, *, by: str = "code") -> dict[str, Any]:
    """Answer the question call ``call_id`` waits on; the question as answered (see the module docstring)."""
    check_session_id(session_id)
    live = _LIVE.get((session_id, call_id))
    if live is not None and live.awaiting() is not None:
        return live.answer(action, content, by)
    part = _find_part(await p.load_recent(session_id), call_id)
    q = awaiting_question(part) if part is not None else None
    if part is None or q is None:
        raise ValueError(f"answer(): call {call_id!r} of session {session_id!r} has no question awaiting an answer; "
                         "see agent.pending_questions(session_id) (or `we0nb questions`).")
    filled = checked(q, action, content)
    try:
        lease = await p.acquire_lease(session_id, new_id("run"))
    except SessionBusyError:
        pass  # the run that asked holds the session: it reads this answer from the store
    else:
        await lease.release()
        raise ValueError(f"answer(): no run is waiting for this answer — the process that asked ended, and the "
                         f"server's question with it; `resume` interrupts call {call_id!r}.")
    assert isinstance(part.state, ToolStateRunning)
    qs = [dict(s) for s in part.state.metadata.get("questions") or ()]
    for s in qs:
        if s.get("id") == q["id"]:
            s.update({"status": action, "answered": now(), "by": by}, **({"content": filled} if filled is not None
                                                                           else {}))
            q = s
    part.state = ToolStateRunning(input=part.state.input, time=part.state.time,
                                  metadata={**part.state.metadata, "questions": qs})
    await p.commit([(None, [part], None)])  # (no lease: the waiting run holds it, and reads this row)
    await p.flush()
    return dict(q)


def _find_part(recent: Any, call_id: str) -> Optional[ToolPart]:
    for m in reversed(recent.messages):
        for part in m.tool_parts:
            if part.call_id == call_id:
                return part
    return None
