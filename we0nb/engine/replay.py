"""Replay: a recorded session's model steps served again, in order, as a model.

:class:`ReplayModel` answers each model call with the next recorded assistant step of a session
(its text, reasoning, tool calls, structured output, usage and finish reason). With ``strict``
each request's history must equal what the recorded run sent for that step — compared as the
model sees it (roles, text, tool calls with their arguments, tool results; ids and times ignored)
— else :class:`~we0nb.ReplayMismatchError` names the step and shows the first difference. Uses:
a regression test of an agent recorded once against a real model and replayed for free; a
debugging re-run; a notebook where no model can run (Binder).

The recording is read at the start of the first run (:meth:`prepare`, before the run writes
anything), from an agent's store, a persistence or a database URL. What the recorded run sent at
step *k* is the history before the *k*-th assistant message as the engine builds it
(:func:`~we0nb.engine.history.to_model_messages`): a finished message never changes, so that is
what was sent. A compaction's summary call is served its summary, never compared; the replaying
agent compacts where the recorded one did only if its model has the recorded model's
``context_window`` (a keyword here), and a strict replay that meets a summary where the agent asks
for a step (or the reverse) says so. A recorded call that failed fails again
(:class:`RecordedModelError`), and so does one the recorded run was stopped in while it streamed
(aborted, killed), after serving what it had streamed: a replay never turns a failure or a
fragment into an answer; a resume of the replaying run is served the next step, as the recorded
run's resume was.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from typing import Any, AsyncIterator, Optional, Sequence

from ..errors import ReplayMismatchError
from ..messages import (UNFINISHED_REASON, AssistantMessage, CompactionPart, MessageWithParts, ReasoningPart,
                        TextPart, ToolPart)
from ..models.base import (AssistantTurn, FinishEvent, Model, ModelEvent, ModelMessage, ModelRequest, ReasoningDelta,
                           ReasoningEnd, TextDelta, ToolCallEvent, ToolResult, UserTurn)
from ..persistence.base import Persistence
from .history import to_model_messages
from .request import check_session_id
from .revert import visible_messages

__all__ = ["ReplayModel", "RecordedStep", "RecordedModelError", "load_steps", "comparable"]


class RecordedModelError(Exception):
    """A recorded model call that failed, failing again in a replay (the run wraps it in a
    :class:`~we0nb.ModelError`, as it wrapped the original failure): ``reason`` and ``message``
    are the recorded error's."""

    def __init__(self, reason: str, message: str):
        super().__init__(f"the recorded model call failed: {reason}: {message}")
        self.reason, self.message = reason, message


@dataclass(frozen=True)
class RecordedStep:
    """One recorded model call: what it answered (``events``) and the history it was sent."""

    message_id: str
    events: tuple[ModelEvent, ...]
    sent: tuple[ModelMessage, ...]
    summary: bool = False
    #: ``(reason, message)`` of a call that failed (its events are what it streamed before)
    failure: Optional[tuple[str, str]] = None


class ReplayModel(Model):
    """Serves the recorded steps of ``session_id`` in ``source`` (an agent, a persistence or a
    database URL) in order; ``strict`` checks each request against the recording.

    Its ``model_id`` is ``replay:<the recorded model>``: a replayed message never claims to be
    from a model that did not run. ``requests`` lists what each call received; ``step`` is the
    number of calls served so far (:meth:`rewind` starts again from the first step).
    ``context_window``: the recorded model's, for a recording that compacted (the replaying agent
    compacts at the same steps only with the same window and ``compaction_threshold``).
    """

    def __init__(self, source: Any, session_id: str, *, strict: bool = True,
                 context_window: Optional[int] = None):
        check_session_id(session_id, "ReplayModel(session_id)")
        if not isinstance(strict, bool):
            raise TypeError(f"ReplayModel(strict=...): expected True or False, got {strict!r}.")
        if context_window is not None and (type(context_window) is not int or context_window <= 0):
            raise ValueError("ReplayModel(context_window=...): expected the recorded model's context window in "
                             f"tokens, a positive int (or None), got {context_window!r}.")
        self.context_window = context_window
        self.source = source
        self.session_id = session_id
        self.strict = strict
        self.step = 0
        self.requests: list[ModelRequest] = []
        self._steps: Optional[list[RecordedStep]] = None
        if isinstance(source, str):
            _check_url(source)
        #: call id → (tool, output, error) of the recorded calls (see :meth:`recorded_tools`)
        self._results: dict[str, tuple[str, Optional[str], Optional[str]]] = {}
        self.model_id = "replay"
        _persistence(source)  # (a bad source fails here, at once)

    @property
    def steps(self) -> int:
        """How many steps were recorded (loaded by the first run; ``await model.prepare()`` loads)."""
        return len(self._steps or ())

    def rewind(self) -> None:
        """Serve the recording again from its first step."""
        self.step = 0

    def recorded_tools(self, tools: Sequence[Any]) -> list[Any]:
        """``tools`` served from the recording instead of executing: each call returns what the
        recorded call with the same call id returned (the replayed steps carry the recorded call
        ids), or fails with the recorded error. Nothing they stand for runs — a replay of an agent
        whose tools have side effects (an order, an e-mail) or need a network. A call the recording
        does not have fails with a clear error (the model sees it). Schemas and policies are the
        tools' own, so the requests are the recorded run's."""
        from dataclasses import replace

        from ..tools import ToolDefinition, tool as make_tool

        out = []
        for t in tools:
            d = t if isinstance(t, ToolDefinition) else make_tool(t)
            out.append(replace(d, function=self._served(d.name), is_async=True, context_param="_we0nb_ctx"))
        return out

    def _served(self, name: str) -> Any:
        from ..tools import ToolError

        async def served(_we0nb_ctx: Any, **kwargs: Any) -> Any:
            await self.prepare()
            got = self._results.get(_we0nb_ctx.call_id)
            if got is None or got[0] != name:
                raise ToolError(f"ReplayModel: the recording of session {self.session_id!r} has no call "
                                f"{_we0nb_ctx.call_id!r} of tool {name!r} to serve.")
            _, output, error = got
            if error is not None:
                raise ToolError(error)
            return output

        return served

    async def prepare(self) -> None:
        if self._steps is not None:
            return
        store, owned = _persistence(self.source)
        try:
            transcript = await store.load_transcript(self.session_id)
        finally:
            if owned:
                await store.close()
        if transcript.session is None:
            raise ValueError(f"ReplayModel: the source has no session {self.session_id!r}; pass a session id "
                             "recorded in that store (see sessions_df(source)).")
        visible = visible_messages(transcript.session, transcript.messages)
        self._steps = load_steps(visible)
        self._results = {p.call_id: (p.tool, getattr(p.state, "output", None), getattr(p.state, "error", None))
                         for m in visible for p in m.tool_parts if p.state.status in ("completed", "error")}
        models = {s for m in transcript.messages if isinstance(m.info, AssistantMessage)
                  for s in [m.info.model_id] if s}
        self.model_id = "replay:" + ",".join(sorted(models)) if models else "replay"

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        await self.prepare()
        assert self._steps is not None
        self.requests.append(request)
        asked_summary = request.purpose == "summary"
        n, recorded = self._next(self._steps, asked_summary)
        if self.strict and not asked_summary:
            _check(self.session_id, n, recorded.sent, request.messages)
        self.step = n
        for event in recorded.events:
            yield event
        if recorded.failure is not None:
            raise RecordedModelError(*recorded.failure)

    def _next(self, steps: list[RecordedStep], asked_summary: bool) -> tuple[int, RecordedStep]:
        """The recorded step that answers this call, and its number (from 1): past the summaries
        the agent did not ask for when not strict (it did not compact there); else a mismatch."""
        if not (self.strict or asked_summary):
            while self.step < len(steps) and steps[self.step].summary:
                self.step += 1
        n = self.step + 1
        if self.step >= len(steps):
            raise ReplayMismatchError(
                f"ReplayModel: step {n} was asked for, but session {self.session_id!r} recorded "
                f"{len(steps)} step(s); the agent called the model more often than the recorded run.",
                step=n)
        recorded = steps[self.step]
        if recorded.summary != asked_summary:
            raise self._compaction_mismatch(n, recorded.summary)
        return n, recorded

    def _compaction_mismatch(self, n: int, recorded_summary: bool) -> ReplayMismatchError:
        if recorded_summary:
            what = ("the recorded run compacted its history here (step {n} is a summary), but the agent asked for "
                    "a model step: give ReplayModel(context_window=...) the recorded model's context window (and "
                    "the agent the recorded compaction_threshold), or pass strict=False to skip the summaries")
        else:
            what = ("the agent compacted its history here (it asked for a summary at step {n}), but the recorded run "
                    "did not: give ReplayModel the recorded model's context_window (or none) and the agent the "
                    "recorded compaction_threshold")
        return ReplayMismatchError(f"ReplayModel: session {self.session_id!r}: " + what.format(n=n) + ".", step=n)


def _persistence(source: Any) -> tuple[Persistence, bool]:
    """The store to read (and whether it was opened here, to close after reading)."""
    if isinstance(source, Persistence):
        return source, False
    p = getattr(source, "persistence", None)
    if isinstance(p, Persistence):
        return p, False
    if isinstance(source, str):
        from ..persistence.sql import SqlPersistence

        return SqlPersistence(source), True
    raise TypeError("ReplayModel(source): expected an agent, a persistence or a database URL, got "
                    f"{type(source).__name__}.")


def _check_url(url: str) -> None:
    """A database URL must name an existing database (a replay never creates one)."""
    import os

    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ValueError(f"ReplayModel(source): {url!r} is not a database URL; pass an agent, a persistence or a "
                         "URL such as 'sqlite:///recording.db'.") from None
    path = parsed.database
    if parsed.get_backend_name() == "sqlite" and path not in (None, "", ":memory:") and not os.path.exists(path):
        raise ValueError(f"ReplayModel(source): there is no database at {path!r}; pass the URL of the recording "
                         "(e.g. 'sqlite:///notebooks/data/local-recording.db').")


def load_steps(messages: Sequence[MessageWithParts]) -> list[RecordedStep]:
    """The recorded model calls of a history: one per assistant message, in order."""
    out: list[RecordedStep] = []
    for i, m in enumerate(messages):
        info = m.info
        if isinstance(info, AssistantMessage):
            failure = _failure(info) or _cut(m, info)
            out.append(RecordedStep(info.id, tuple(_events(m, info, failed=failure is not None)),
                                    tuple(to_model_messages(messages[:i])), summary=info.summary, failure=failure))
    return out


def _events(m: MessageWithParts, info: AssistantMessage, *, failed: bool) -> list[ModelEvent]:
    """What the model streamed for this message, as the engine received it (``failed``: the call
    failed after that, so no finish)."""
    events: list[ModelEvent] = []
    calls = False
    for p in m.parts:
        if isinstance(p, TextPart) and not p.synthetic and p.text:
            events.append(TextDelta(p.text))
        elif isinstance(p, ReasoningPart):
            if p.text:
                events.append(ReasoningDelta(p.text))
            events.append(ReasoningEnd(p.signature, p.redacted))
        elif isinstance(p, CompactionPart):
            events.append(TextDelta(p.summary))
        elif isinstance(p, ToolPart):
            calls = True
            st = p.state
            original = st.metadata.get("original_input")
            args = original if isinstance(original, dict) else st.input
            events.append(ToolCallEvent(p.call_id, p.tool, dict(args)))
    if failed:
        return events
    reason = info.finish_reason or ("tool-calls" if calls else "stop")
    events.append(FinishEvent(reason, info.usage.model_copy()))
    return events


def _failure(info: AssistantMessage) -> Optional[tuple[str, str]]:
    """The recorded failure of a model call: an error on a message that never finished (an
    interrupted message, closed by a later recovery, is not one: its call was cut, not failed)."""
    error = info.error
    if error is None or info.finish_reason is not None or error.reason == UNFINISHED_REASON:
        return None
    return error.reason, error.message


#: what a replay says of a recorded model call that was cut off (see :func:`_cut`)
CUT_REASON = "cut off"
CUT_MESSAGE = "the recorded run was stopped (aborted or killed) during this call, after what it had streamed"


def _cut(m: MessageWithParts, info: AssistantMessage) -> Optional[tuple[str, str]]:
    """A recorded model call cut off while it streamed: no finish, and none of its calls started
    in the live run (calls run once the reply has ended, so a step with a call that ran, waited
    for a person or was blocked by another was cut while they ran: its reply was whole). Served
    as what it streamed, then a failure: the run that replays it stops there too, and a resume
    asks for the next step, as the recorded run's resume did — never a fragment as an answer."""
    if info.finish_reason is not None or any(_started_live(p) for p in m.tool_parts):
        return None
    error = info.error
    return (CUT_REASON, CUT_MESSAGE) if error is None or error.reason == UNFINISHED_REASON else None


def _started_live(p: ToolPart) -> bool:
    """Whether the call started (or was decided on) in the live run, not only in a recovery after it."""
    return p.attempts - int(p.recalled) > 0 or p.approval is not None or p.interrupt_reason == "blocked"


def comparable(m: ModelMessage) -> dict[str, Any]:
    """A history item as strict replay compares it: roles, text, tool calls with their arguments,
    tool results (no ids, no times)."""
    if isinstance(m, UserTurn):
        return {"role": "user", "text": m.text}
    if isinstance(m, AssistantTurn):
        return {"role": "assistant", "text": m.text,
                "tool_calls": [{"name": c.name, "input": c.input} for c in m.tool_calls]}
    assert isinstance(m, ToolResult)
    return {"role": "tool", "name": m.name, "content": m.content, "is_error": m.is_error}


def _check(session_id: str, step: int, recorded: Sequence[ModelMessage], sent: Sequence[ModelMessage]) -> None:
    want = [comparable(m) for m in recorded]
    got = [comparable(m) for m in sent]
    if want == got:
        return
    k = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
    a = _lines(want[k] if k < len(want) else None)
    b = _lines(got[k] if k < len(got) else None)
    diff = "\n".join(difflib.unified_diff(a, b, "recorded", "sent", lineterm="", n=2))
    raise ReplayMismatchError(
        f"ReplayModel: step {step} of session {session_id!r} differs from the recording at history item "
        f"{k + 1} (recorded {len(want)} item(s), sent {len(got)}):\n{diff}", step=step)


def _lines(item: Optional[dict[str, Any]]) -> list[str]:
    if item is None:
        return ["(nothing)"]
    return json.dumps(item, indent=1, ensure_ascii=False, sort_keys=True).splitlines()
