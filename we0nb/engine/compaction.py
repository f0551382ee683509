"""Compaction: when the history outgrows the model, summarise it and end the run.

**When.** After every step, :meth:`Compactor.due` compares the step's reported input
tokens with ``compaction_threshold × model.context_window`` (``We0Agent`` option, default
0.8; ``None`` turns compaction off; a model without a ``context_window`` is never
compacted on size). A step that reports no input tokens (servers that send no usage in
streams, e.g. llama-cpp-python's) is measured by an estimate of the history instead (4
characters a token, see :func:`estimate_history`), and the ``we0nb.engine`` logger warns
once per model that it estimates. A step that fails with
:class:`~we0nb.errors.ContextWindowExceeded` compacts too.

**What.** The engine asks the model for a summary: a :class:`ModelRequest` with
``purpose="summary"``, no tools, the history the model currently sees plus an instruction
(``We0Agent(compaction_prompt=...)`` replaces the default one). When that request itself
overflows, the history sent for the summary is shrunk (long contents cut, then the oldest
turns dropped; an earlier summary is always kept) and the request tried again, a few
times. The summary is persisted as a new assistant message with ``summary=True`` holding
one :class:`CompactionPart`. The history before it is kept in the transcript but no
longer sent: the model sees the summary (as a user turn) and what follows it. The run
yields ``{"type": "compaction", "part": CompactionPart, "message": AssistantMessage}`` and
ends with ``result == "compact"``.

**The recent tail.** If the turn was not finished (the step ended with tool calls, or it
overflowed), the engine also writes, after the summary, a synthetic copy of the turn's
user message (its text part is ``synthetic=True``, with a note asking the model to carry on
from the summary without repeating finished steps). That copy is the recent tail: a
following ``mode="resume"`` sends *summary + that user message* and continues the turn.
If the turn was finished, nothing follows the summary: ``resume`` has nothing to do, and
the next ``prompt`` sends *summary + the new user message*.

**No loop.** Compaction is an error (:class:`~we0nb.errors.CompactionError`, nothing is
written) when the summary is not smaller than the threshold or than the history it
replaces, and when the first step after a summary is itself over the threshold (or
overflows the context window): summarising again could not help. Raise the context
window, lower the instruction's verbosity, or start a new session.
"""

from __future__ import annotations

import asyncio
import json
import logging
import weakref
from typing import TYPE_CHECKING, Any, AsyncIterator, Optional, Sequence

from .._ids import now
from ..errors import CompactionError, ContextWindowExceeded, ModelError
from ..messages import AssistantMessage, CompactionPart, MessageTime, MessageWithParts, Usage, assembled, snapshot
from ..models.base import (OWN_PROVIDER, AssistantTurn, FinishEvent, ModelMessage, ModelRequest, TextDelta, ToolResult,
                           UserTurn)
from ..models.pricing import add_cost, call_cost
from ..persistence.base import Write
from .abort import Aborted
from .events import Event
from .history import SUMMARY_PREFIX
from .processor import close_stream

if TYPE_CHECKING:  # pragma: no cover
    from .state import RunState

__all__ = ["Compactor", "DEFAULT_COMPACTION_PROMPT", "TAIL_NOTE", "estimate_tokens", "estimate_history"]

log = logging.getLogger("we0nb.engine")

#: the models already warned about (no usage reported: compaction estimates)
_WARNED: "weakref.WeakSet[Any]" = weakref.WeakSet()

DEFAULT_COMPACTION_PROMPT = (
    "The conversation above is getting too long for your context window. Write a summary of it "
    "that lets you continue the work from the summary alone. Include: the user's requests and "
    "goals; the important facts, results and tool outputs (with exact values, names, paths and "
    "ids); decisions made; which tool calls and steps are already DONE (they must not be "
    "repeated); and what remains to be done next. Be concise. Reply with the summary only."
)

TAIL_NOTE = ("\n\n[Re-sent after the conversation was summarised: continue this request from where the "
             "summary leaves off; do not repeat steps the summary lists as done.]")

#: how many times a summary request that overflows is shrunk and tried again
SHRINK_ATTEMPTS = 4
_CUT = 2000


def estimate_tokens(text: str) -> int:
    """A rough token count (4 characters a token) for when the model reports no usage."""
    return (len(text) + 3) // 4


def estimate_history(history: Sequence[ModelMessage], system: Optional[str] = None, tools: Sequence[Any] = ()) -> int:
    """A rough token count of a request (its texts, tool calls and tool schemas)."""
    chars = len(system or "")
    for m in history:
        if isinstance(m, AssistantTurn):
            chars += len(m.text) + sum(len(c.name) + len(json.dumps(c.input)) for c in m.tool_calls)
        elif isinstance(m, ToolResult):
            chars += len(m.content)
        else:
            chars += len(m.text)
    for t in tools:
        chars += len(t.name) + len(t.description) + len(json.dumps(t.parameters))
    return (chars + 3) // 4 + 4 * len(history)  # (+4 a message: the chat template's own tokens)


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    head, tail = text[: limit * 2 // 3], text[-(limit // 3):]
    return f"{head}\n[… {len(text) - len(head) - len(tail)} characters cut for the summary …]\n{tail}"


def shrink(history: list[ModelMessage], level: int) -> list[ModelMessage]:
    """A smaller history for the summary request: level 1 cuts long contents, every further
    level also drops the older half of the turns (a leading earlier summary is kept)."""
    limit = max(200, _CUT >> max(0, level - 1))
    out: list[ModelMessage] = []
    for m in history:
        if isinstance(m, UserTurn):
            out.append(m if m.text.startswith(SUMMARY_PREFIX) else UserTurn(_cut(m.text, limit)))
        elif isinstance(m, AssistantTurn):
            out.append(AssistantTurn(_cut(m.text, limit), "", list(m.tool_calls)))
        elif isinstance(m, ToolResult):
            out.append(ToolResult(m.call_id, m.name, _cut(m.content, limit), m.is_error))
    for _ in range(level - 1):
        keep_first = 1 if out and isinstance(out[0], UserTurn) and out[0].text.startswith(SUMMARY_PREFIX) else 0
        rest = out[keep_first:]
        if len(rest) <= 1:
            break
        rest = rest[len(rest) // 2:]
        while rest and isinstance(rest[0], ToolResult):  # a result without its call is invalid
            rest = rest[1:]
        out = out[:keep_first] + rest
    return out


class Compactor:
    """The compaction state of one run; it works through the run's :class:`RunState`."""

    def __init__(self, state: "RunState"):
        self.state = state
        self.overflow: Optional[ModelError] = None
        self.compacted = False
        self._trigger: Optional[int] = None

    # ------------------------------------------------------------------ decisions

    @property
    def enabled(self) -> bool:
        return getattr(self.state.agent, "compaction_threshold", None) is not None

    def limit(self) -> Optional[int]:
        """The input-token count above which a step triggers compaction (None: never on size)."""
        threshold = getattr(self.state.agent, "compaction_threshold", None)
        window = getattr(self.state.agent.model, "context_window", None)
        if threshold is None or not window:
            return None
        return int(threshold * window)

    def _first_after_summary(self) -> bool:
        """Whether the last message (this step) is the first step since the latest summary."""
        msgs = self.state.messages
        for i in range(len(msgs) - 2, -1, -1):
            info = msgs[i].info
            if info.role == "assistant":
                return bool(getattr(info, "summary", False))
        return False

    async def on_model_error(self, exc: ModelError) -> bool:
        """A failed step: True when it overflowed the context and compaction will answer it."""
        overflow = exc if isinstance(exc, ContextWindowExceeded) else exc.cause
        if not isinstance(overflow, ContextWindowExceeded) or not self.enabled:
            return False
        if self._first_after_summary():
            raise CompactionError(
                f"The first step after a compaction summary still does not fit the context window of "
                f"{self.state.agent.model.model_id!r} in session {self.state.session_id!r} ({overflow}). "
                "Summarising again cannot help: use a model with a larger context window or start a new session."
            ) from exc
        self.overflow = exc
        return True

    def due(self) -> bool:
        """After a step: should the run compact now? Raises CompactionError for a loop."""
        if self.overflow is not None:
            return True
        limit = self.limit()
        if limit is None or not self.state.messages:
            return False
        last = self.state.messages[-1].info
        if last.role != "assistant":
            return False
        tokens = last.usage.input_tokens or self._estimate()
        if tokens <= limit:
            return False
        if self._first_after_summary():
            raise CompactionError(
                f"The first step after a compaction summary already used {tokens} input tokens, over the "
                f"compaction threshold of {limit} tokens ({self.state.agent.compaction_threshold:g} of the "
                f"{self.state.agent.model.context_window}-token context window) in session "
                f"{self.state.session_id!r}: compacting again would loop. Raise compaction_threshold or the "
                "model's context_window, or start a new session."
            )
        self._trigger = tokens
        return True

    def _estimate(self) -> int:
        """The history's size when the model reported no input tokens (warned once per model)."""
        state, model = self.state, self.state.agent.model
        try:
            first = model not in _WARNED
            if first:
                _WARNED.add(model)
        except TypeError:  # not weak-referenceable: warn every time rather than never
            first = True
        if first:
            _say_no_usage(model)
        return estimate_history(state.history.build(state.messages), state.agent.system_prompt,
                                state.tools.schemas)

    # ------------------------------------------------------------------ the summary

    async def _ask(self, request: ModelRequest) -> tuple[str, Usage]:
        """Stream the summary (abortable like a step); returns its text and usage."""
        scope = self.state.scope
        stream = self.state.agent.model.stream(request)
        it = stream.__aiter__()
        chunks: list[str] = []
        usage = Usage()
        try:
            while True:
                try:
                    ev = await scope.next(it)
                except StopAsyncIteration:
                    break
                if isinstance(ev, TextDelta):
                    chunks.append(ev.text)
                elif isinstance(ev, FinishEvent):
                    usage = ev.usage
                # reasoning and (unrequested) tool calls are not part of a summary
        finally:
            await close_stream(stream)
        return "".join(chunks).strip(), usage

    async def _summarize(self) -> tuple[str, Usage]:
        state, agent = self.state, self.state.agent
        history = state.history.build(state.messages)  # (older messages may be stored views only)
        instruction = getattr(agent, "compaction_prompt", None) or DEFAULT_COMPACTION_PROMPT
        total = Usage()
        level = 0
        while True:
            msgs = shrink(history, level) if level else list(history)
            request = ModelRequest(messages=msgs + [UserTurn(instruction)], tools=[],
                                   system=agent.system_prompt, purpose="summary")
            try:
                text, usage = await self._ask(request)
            except ContextWindowExceeded as exc:
                level += 1
                if level > SHRINK_ATTEMPTS:
                    raise CompactionError(
                        f"Compaction failed in session {self.state.session_id!r}: even a shortened history "
                        f"does not fit the context window of {agent.model.model_id!r} ({exc})."
                    ) from exc
                continue
            except (asyncio.CancelledError, Aborted, CompactionError):
                raise
            except Exception as exc:
                raise CompactionError(
                    f"The model failed while writing the compaction summary of session "
                    f"{self.state.session_id!r}: {type(exc).__name__}: {exc}. Nothing was written; "
                    "resume to try again."
                ) from exc
            return text, total + usage

    # ------------------------------------------------------------------ compaction

    async def compact(self) -> AsyncIterator[Event]:
        """Summarise; persist the summary (with the closing of a failed step and the recent tail)
        in one transaction; yield the ``compaction`` event."""
        state = self.state
        last = state.messages[-1] if state.messages else None
        mid_turn = self.overflow is not None or bool(
            last is not None and last.info.role == "assistant" and last.tool_parts)
        text, usage = await self._summarize()
        self._check_summary(text, usage)
        state.scope.check()
        closed = self._close_failed_step(last)
        t = now()
        summary = AssistantMessage(id=state.ids("msg"), session_id=state.session_id,
                                   time=MessageTime(created=t, completed=t), parent_id=state.parent_id(),
                                   model_id=state.agent.model.model_id, usage=usage, finish_reason="stop",
                                   summary=True, cost=call_cost(state.agent.model, usage, t))
        part = CompactionPart(id=state.ids("prt"), session_id=state.session_id, message_id=summary.id,
                              summary=text, time=t)
        done = assembled(MessageWithParts, info=summary, parts=[part])
        tail = self._tail() if mid_turn else None
        writes: list[Write] = [(summary, [part], state.writer.view_of(done))]
        if tail is not None:
            writes.append((tail.info, tail.parts, state.writer.view_of(tail)))
        # one durability point: a crash keeps all of it or none (then resume compacts again)
        await state.writer.write(closed.info if closed else None, final=closed, then=writes)
        await state.writer.p.flush()
        state.messages.append(done)
        if tail is not None:
            state.add_user_message(tail)
        state.usage = state.usage + usage
        state.cost = add_cost(state.cost, summary.cost)
        state.history.invalidate()
        self.compacted = True
        yield {"type": "compaction", "part": snapshot(part), "message": snapshot(summary)}

    def _check_summary(self, text: str, usage: Usage) -> None:
        """Refuse a summary that is empty or would not shrink the context (it would loop)."""
        sid = self.state.session_id
        if not text:
            raise CompactionError(
                f"The model returned an empty compaction summary in session {sid!r}; nothing was written. "
                "Resume to try again, or set We0Agent(compaction_prompt=...)."
            )
        size = usage.output_tokens or estimate_tokens(text)
        limit = self.limit()
        replaced = self._trigger or usage.input_tokens or None
        if (limit is not None and size >= limit) or (replaced is not None and size >= replaced):
            bound = f"the compaction threshold ({limit} tokens)" if limit is not None and size >= limit \
                else f"the history it replaces ({replaced} tokens)"
            raise CompactionError(
                f"The compaction summary of session {sid!r} is {size} tokens, no smaller than {bound}: "
                "compacting would loop. Nothing was written; use a larger context window or a terser "
                "compaction_prompt."
            )

    def _close_failed_step(self, last: Optional[MessageWithParts]) -> Optional[MessageWithParts]:
        """The step that overflowed: closed (its error stays on it); the summary takes over."""
        if self.overflow is None or last is None or not isinstance(last.info, AssistantMessage):
            return None
        info = last.info
        if info.time.completed is not None:
            return None
        info.time = MessageTime(created=info.time.created, completed=now())
        if info.error is not None:
            info.error = info.error.model_copy(update={"metadata": {**info.error.metadata, "compacted": True}})
        return last

    def _tail(self) -> Optional[MessageWithParts]:
        """The turn's user message again, after the summary, so a resume continues the turn."""
        source = next((m for m in reversed(self.state.messages) if m.info.role == "user"), None)
        if source is None:
            return None
        original = source.text
        if not original.endswith(TAIL_NOTE):
            original += TAIL_NOTE
        return self.state.user_message(original, synthetic=True)


def _say_no_usage(model: Any) -> None:
    """That compaction estimates the context: a warning with what to do, or at INFO when the model
    says why it never reports usage (nothing to turn on)."""
    name = getattr(model, "model_id", type(model).__name__)
    known = getattr(model, "usage_unreported", None)
    if known:
        log.info("%s reports no token usage (%s), so compaction estimates the context from the text "
                 "(4 characters a token).", name, known)
        return
    # (the package's test doubles have no server: their scripts say what a call used)
    advice = ("Give its steps usage(...) to drive compaction by tokens."
              if getattr(model, "provider_name", None) == OWN_PROVIDER
              else "If its server can send usage in streams, turn it on.")
    log.warning("%s reports no token usage, so compaction estimates the context from the text "
                "(4 characters a token). %s", name, advice)
