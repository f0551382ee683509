"""Compaction: when the history outgrows the model, summarise it and end the run.

**When.** After every step, :meth:`Compactor.due` compares the step's reported input
tokens with ``compaction_threshold × model.context_window`` (``We0Agent`` option, default
0.8; ``None`` turns compaction off; a model without a ``context_window`` is never
compacted on size). A step that fails with
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
from typing import TYPE_CHECKING, Any, AsyncIterator, Optional

from .._ids import new_id, now
from ..errors import CompactionError, ContextWindowExceeded, ModelError
from ..messages import (
    AssistantMessage,
    CompactionPart,
    MessageTime,
    MessageWithParts,
    Usage,
)
from ..models.base import AssistantTurn, FinishEvent, ModelMessage, ModelRequest, TextDelta, ToolResult, UserTurn
from .history import SUMMARY_PREFIX

if TYPE_CHECKING:  # pragma: no cover
    from .loop import Run

__all__ = ["Compactor", "DEFAULT_COMPACTION_PROMPT", "TAIL_NOTE", "estimate_tokens"]

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
    """The compaction state of one :class:`~we0nb.engine.loop.Run`."""

    def __init__(self, run: "Run"):
        self.run = run
        self.overflow: Optional[ModelError] = None
        self.compacted = False
        self._trigger: Optional[int] = None

    # ------------------------------------------------------------------ decisions

    @property
    def enabled(self) -> bool:
        return getattr(self.run.agent, "compaction_threshold", None) is not None

    def limit(self) -> Optional[int]:
        """The input-token count above which a step triggers compaction (None: never on size)."""
        threshold = getattr(self.run.agent, "compaction_threshold", None)
        window = getattr(self.run.agent.model, "context_window", None)
        if threshold is None or not window:
            return None
        return int(threshold * window)

    def _first_after_summary(self) -> bool:
        """Whether the last message (this step) is the first step since the latest summary."""
        msgs = self.run.messages
        for i in range(len(msgs) - 2, -1, -1):
            info = msgs[i].info
            if info.role == "assistant":
                return bool(getattr(info, "summary", False))
        return False

    async def on_model_error(self, exc: ModelError) -> bool:
        """A failed step: True when it overflowed the context and compaction will answer it."""
        if not isinstance(exc.cause, ContextWindowExceeded) or not self.enabled:
            return False
        if self._first_after_summary():
            raise CompactionError(
                f"The first step after a compaction summary still does not fit the context window of "
                f"{self.run.agent.model.model_id!r} in session {self.run.session_id!r} ({exc.cause}). "
                "Summarising again cannot help: use a model with a larger context window or start a new session."
            ) from exc
        self.overflow = exc
        return True

    def due(self) -> bool:
        """After a step: should the run compact now? Raises CompactionError for a loop."""
        if self.overflow is not None:
            return True
        limit = self.limit()
        if limit is None or not self.run.messages:
            return False
        last = self.run.messages[-1].info
        if last.role != "assistant":
            return False
        tokens = last.usage.input_tokens
        if tokens <= limit:
            return False
        if self._first_after_summary():
            raise CompactionError(
                f"The first step after a compaction summary already used {tokens} input tokens, over the "
                f"compaction threshold of {limit} tokens ({self.run.agent.compaction_threshold:g} of the "
                f"{self.run.agent.model.context_window}-token context window) in session "
                f"{self.run.session_id!r}: compacting again would loop. Raise compaction_threshold or the "
                "model's context_window, or start a new session."
            )
        self._trigger = tokens
        return True

    # ------------------------------------------------------------------ the summary

    async def _ask(self, request: ModelRequest) -> tuple[str, Usage]:
        """Stream the summary (abortable like a step); returns its text and usage."""
        run = self.run
        stream = run.agent.model.stream(request)
        it = stream.__aiter__()
        task = asyncio.current_task()
        chunks: list[str] = []
        usage = Usage()
        try:
            while True:
                run._check_abort()
                run._blocked_task = task
                try:
                    ev = await it.__anext__()
                except StopAsyncIteration:
                    break
                finally:
                    run._blocked_task = None
                if isinstance(ev, TextDelta):
                    chunks.append(ev.text)
                elif isinstance(ev, FinishEvent):
                    usage = ev.usage
                # reasoning and (unrequested) tool calls are not part of a summary
        finally:
            await run._close_stream(stream)
        return "".join(chunks).strip(), usage

    async def _summarize(self) -> tuple[str, Usage]:
        run, agent = self.run, self.run.agent
        history = run.history.build(run.messages)  # (older messages may be stored views only)
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
                        f"Compaction failed in session {self.run.session_id!r}: even a shortened history "
                        f"does not fit the context window of {agent.model.model_id!r} ({exc})."
                    ) from exc
                continue
            except (asyncio.CancelledError, CompactionError):
                raise
            except Exception as exc:
                from .loop import _Aborted  # (a late import: loop imports this module)

                if isinstance(exc, _Aborted):
                    raise
                raise CompactionError(
                    f"The model failed while writing the compaction summary of session "
                    f"{self.run.session_id!r}: {type(exc).__name__}: {exc}. Nothing was written; "
                    "resume to try again."
                ) from exc
            return text, total + usage

    # ------------------------------------------------------------------ compaction

    async def compact(self) -> AsyncIterator[dict[str, Any]]:
        """Summarise, persist summary (+ recent tail), yield the ``compaction`` event."""
        run, p, sid = self.run, self.run.p, self.run.session_id
        last = run.messages[-1] if run.messages else None
        mid_turn = self.overflow is not None or bool(
            last is not None and last.info.role == "assistant" and last.tool_parts)
        text, usage = await self._summarize()
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
        run._check_abort()

        if self.overflow is not None and last is not None and isinstance(last.info, AssistantMessage):
            # the failed step: close it (its error stays on it); the summary takes over
            info = last.info
            if info.time.completed is None:
                info.time = MessageTime(created=info.time.created, completed=now())
                info.error = info.error.model_copy(update={"metadata": {**info.error.metadata, "compacted": True}}) \
                    if info.error is not None else None
                await run._write(info, final=last)

        t = now()
        summary = AssistantMessage(id=new_id("msg"), session_id=sid, time=MessageTime(created=t, completed=t),
                                   parent_id=run._parent_id(), model_id=run.agent.model.model_id,
                                   usage=usage, finish_reason="stop", summary=True)
        part = CompactionPart(id=new_id("prt"), session_id=sid, message_id=summary.id, summary=text, time=t)
        done = MessageWithParts.model_construct(info=summary, parts=[part])
        await p.upsert_batch(summary, [part], view=run.view_of(done))
        run.messages.append(done)
        run.usage = run.usage + usage

        if mid_turn:
            source = next((m for m in reversed(run.messages) if m.info.role == "user"), None)
            if source is not None:
                original = source.text
                if not original.endswith(TAIL_NOTE):
                    original += TAIL_NOTE
                await run.append_user_message(original, synthetic=True)
        await p.flush()
        run.history.invalidate()
        self.compacted = True
        yield {"type": "compaction", "part": part.model_copy(), "message": summary.model_copy()}
