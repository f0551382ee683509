"""One model step: the model's stream turned into parts and events.

Deltas are the hot path (thousands per second): the run's outermost generator reads the
stream itself (:class:`ModelStream`, :meth:`~we0nb.engine.run.Run.events`), and a delta takes
a type test, a buffer append, a dict and a flag test; everything else goes through
:meth:`StepProcessor.handle`. Text is repaired
as it arrives (surrogate halves joined, lone ones replaced: :mod:`we0nb._text`); tool
arguments given as JSON text are parsed once, so what is persisted is what runs; a call
id the model repeats within a step is made unique, so results pair with their calls. A
:class:`~we0nb.models.base.ReasoningEnd` closes the reasoning part with the provider's
signature (a redacted block becomes a part of its own), so it can be sent back later.

When the model fails, what it produced so far is persisted: an ``Exception`` is recorded
on the (unfinished) assistant message and reaches the caller — a provider's own error as
itself, anything else wrapped in :class:`~we0nb.ModelError`; a ``KeyboardInterrupt`` or
``SystemExit`` is re-raised as it is, after the same write. A failing *store* is not a
model failure: its :class:`~we0nb.PersistenceError` passes through untouched.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Any, AsyncIterator, Optional

from .._ids import call_key, now
from .._json import clip_depth, too_deep
from .._text import SurrogateJoiner, clean, clean_json
from ..errors import ModelError, ModelProviderError, PersistenceError
from ..messages import (
    AssistantMessage,
    MessageError,
    MessageWithParts,
    PartTime,
    ReasoningPart,
    TextPart,
    ToolApproval,
    ToolPart,
    ToolStatePending,
    snapshot,
)
from ..models.base import FinishEvent, ModelRequest, ReasoningEnd, ToolCallEvent
from .abort import Aborted
from .events import Event

if TYPE_CHECKING:  # pragma: no cover
    from .state import RunState

__all__ = ["StepProcessor", "ModelStream", "close_stream", "tool_input"]

log = logging.getLogger("we0nb.engine")


def tool_input(raw: Any) -> tuple[dict[str, Any], Optional[str]]:
    """A call's arguments as ``(input, raw)``: a dict (JSON text parsed once), or ``({}, text)``
    when they are not a JSON object or nest too deeply (the executor then reports a tool-input
    error; a too-deep object is kept as its JSON cut below the limit, see :mod:`we0nb._json`)."""
    if isinstance(raw, dict):
        if too_deep(raw):
            return {}, json.dumps(clip_depth(raw), ensure_ascii=False, default=str)
        return clean_json(raw), None
    text = clean(str(raw))
    try:
        value = json.loads(text) if text.strip() else {}
    except (ValueError, RecursionError):  # RecursionError: nested past Python's stack
        return {}, text
    if not isinstance(value, dict) or too_deep(value):
        return {}, text
    return clean_json(value), None


async def close_stream(stream: Any) -> None:
    """Close a model stream after an error or an abort: a failure to close is logged, never
    allowed to hide the error in flight; cancellation and interrupts still propagate."""
    aclose = getattr(stream, "aclose", None)
    if aclose is None:
        return
    try:
        await aclose()
    except Exception as e:
        log.warning("closing the model stream failed: %s: %s", type(e).__name__, e)


class ModelStream:
    """The step's model stream, handed up to the run's outermost generator, which reads it
    there (:meth:`~we0nb.engine.run.Run.events`): a delta then crosses one generator, the
    consumer's, instead of every level of the run. The run hands the stream's other events to
    :meth:`StepProcessor.handle`, puts what ended the read in ``error`` (None: it ended), and
    resumes :meth:`StepProcessor.run`, which finishes the step from there.

    ``prelude``: the run's own events to yield once the model's first event is in, before it
    is used (a pipelined run's step start, committed while the model call went out)."""

    __slots__ = ("it", "processor", "prelude", "error")

    def __init__(self, it: AsyncIterator[Any], processor: "StepProcessor",
                 prelude: Optional[AsyncIterator[Event]]) -> None:
        self.it = it
        self.processor = processor
        self.prelude = prelude
        self.error: Optional[BaseException] = None


class StepProcessor:
    """Turns the model stream of one step into the parts of ``msg`` and stream events."""

    def __init__(self, state: "RunState", msg: MessageWithParts) -> None:
        self.state = state
        self.msg = msg
        self.info: AssistantMessage = msg.info  # type: ignore[assignment]
        #: the model's finish event (None: it sent none, a default finish is used)
        self.finish: Optional[FinishEvent] = None
        self.joiner = SurrogateJoiner()
        self._call_ids: set[str] = set()

    async def run(self, request: ModelRequest,
                  prelude: Optional[AsyncIterator[Event]] = None) -> AsyncIterator["Event | ModelStream"]:
        """Start the model's reply and hand its stream up (:class:`ModelStream`); once it has
        been read, every part is written or marked and the last part closed."""
        state = self.state
        writer = state.writer
        stream = None
        try:
            stream = state.agent.model.stream(request)
            handed = ModelStream(stream.__aiter__(), self, prelude)
            yield handed
            if state.observer is not None:
                state.observer.model_ended(state.steps, handed.error, self.finish)
            if handed.error is not None:
                raise handed.error
        except BaseException as exc:
            wrapped = await self._failed(exc, stream)
            if wrapped is not None:
                raise wrapped from exc
            raise
        finally:
            writer.stop_flush_clock()
        if self.msg.tool_parts:  # (their write-ahead follows: keep the text's end before it)
            for out in await self._close_open():
                yield out
        else:
            self._hold_close()

    async def handle(self, ev: Any) -> list[Event]:
        """Every model event but the deltas: tool calls, reasoning ends and the finish."""
        cls = type(ev)
        if cls is ToolCallEvent:
            out = await self._close_open()
            tp = self._tool_call(ev)
            out.append({"type": "tool", "part": self.state.snap(tp)})
            if tp.approval == "requested":
                # durability point: the request is stored before anything else happens
                await self.state.writer.write(None, tp)
                out.append({"type": "approval-request", "part": snapshot(tp)})
            return out
        if cls is FinishEvent:
            self.finish = ev
            return []
        if cls is ReasoningEnd:
            return await self._reasoning_end(ev)
        raise TypeError(f"The model streamed an unknown event {ev!r}.")

    # ------------------------------------------------------------------ parts

    async def open_part(self, kind: str) -> list[Event]:
        """Start a text or reasoning part (closing the other kind first)."""
        out = await self._close_open()
        state, info = self.state, self.info
        part: "TextPart | ReasoningPart"
        if kind == "text":
            part = TextPart(id=state.ids("prt"), session_id=info.session_id, message_id=info.id,
                            time=PartTime(start=now()))
            out.append({"type": "text-start", "part": state.snap(part)})
        else:
            part = ReasoningPart(id=state.ids("prt"), session_id=info.session_id, message_id=info.id,
                                 time=PartTime(start=now()))
            out.append({"type": "reasoning-start", "part": state.snap(part)})
        self.msg.parts.append(part)
        state.writer.open_part(part)
        state.writer.mark(part)  # (written with the first flush, at the latest ``flush_interval`` on)
        return out

    async def _reasoning_end(self, ev: ReasoningEnd) -> list[Event]:
        """Close the open reasoning part with its signature; a redacted block (or a signature
        without text) becomes a reasoning part of its own."""
        open_part = self.state.writer.open
        if ev.redacted is None and isinstance(open_part, ReasoningPart):
            open_part.signature = ev.signature
            return await self._close_open()
        if ev.redacted is None and ev.signature is None:
            return []  # nothing to keep: the next part closes the open one
        out = await self._close_open()
        state, info, t = self.state, self.info, now()
        part = ReasoningPart(id=state.ids("prt"), session_id=info.session_id, message_id=info.id,
                             time=PartTime(start=t, end=t), signature=ev.signature, redacted=ev.redacted)
        self.msg.parts.append(part)
        await state.writer.write(None, part)
        out.append({"type": "reasoning-start", "part": snapshot(part)})
        out.append({"type": "reasoning-end", "part": snapshot(part)})
        return out

    def _hold_close(self) -> None:
        """The stream ended on text and no call follows: the part's end is held for the step's
        end, the next commit (nothing runs in between), and so is its event."""
        writer = self.state.writer
        closed = writer.close_open(tail=self.joiner.flush())
        if closed is not None:
            writer.hold(None, (closed,), None, [self._end_event(closed)])

    async def _close_open(self) -> list[Event]:
        writer = self.state.writer
        if writer.open is None:
            return []
        closed = await writer.flush_open(close=True, tail=self.joiner.flush())
        assert closed is not None
        return [self._end_event(closed)]

    def _end_event(self, part: "TextPart | ReasoningPart") -> Event:
        if isinstance(part, TextPart):
            return {"type": "text-end", "part": self.state.snap(part)}
        return {"type": "reasoning-end", "part": self.state.snap(part)}

    def _tool_call(self, ev: ToolCallEvent) -> ToolPart:
        """A pending call: not a durability point, it goes with the next commit."""
        state, info = self.state, self.info
        inp, raw = tool_input(ev.input)
        call_id = clean(ev.call_id) or state.ids("call")
        if call_id in self._call_ids:  # a repeated id would pair results with the wrong call
            call_id = f"{call_id}~{len(self._call_ids)}"
        self._call_ids.add(call_id)
        name = clean(ev.name)
        part_id = state.ids("prt")
        tp = ToolPart(id=part_id, session_id=info.session_id, message_id=info.id, call_id=call_id, tool=name,
                      state=ToolStatePending(input=inp, raw=raw,
                                             metadata={"idempotency_key": call_key(info.session_id, part_id)}))
        why = state.approval_reason(name, inp)
        if why is not None:
            tp.approval = "requested"
            tp.approval_detail = ToolApproval(requested=now(), why=why)
        self.msg.parts.append(tp)
        state.writer.mark(tp)
        return tp

    # ------------------------------------------------------------------ failure

    def _refused(self, exc: BaseException) -> bool:
        """The provider refused the request (an HTTP 4xx: a rate limit, a bad request, a context
        too long) before any output: it bills nothing, so the call's cost is known — 0, not unknown."""
        status = exc.status_code if isinstance(exc, ModelProviderError) else None
        return status is not None and 400 <= status < 500 and all(p.type == "step-start" for p in self.msg.parts)

    async def _failed(self, exc: BaseException, stream: Any) -> Optional[ModelError]:
        """Persist what the step produced and record a model failure on the message.

        Returns the ModelError to raise instead of ``exc`` (an ordinary exception from the
        model), or None to re-raise ``exc`` as it is (our own model errors, with their ids
        set; aborts; interrupts; store failures)."""
        await close_stream(stream)
        writer = self.state.writer
        if isinstance(exc, (Aborted, asyncio.CancelledError, GeneratorExit)) or writer.lost:
            return None  # the run persists on abort/cancel; a lost lease writes nothing
        if isinstance(exc, PersistenceError):
            return None  # the store failed, not the model
        writer.keep_open()
        if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit: keep the text, re-raise
            await writer.write(None)
            return None
        info = self.info
        info.error = MessageError(reason=type(exc).__name__, message=clean(str(exc) or repr(exc)),
                                  metadata={"step": self.state.steps})
        if self._refused(exc):
            info.cost = 0.0  # (the provider refused the request: a known price, nothing to pay)
        await writer.write(info)
        await writer.p.flush()
        if isinstance(exc, ModelError):
            exc.session_id, exc.message_id = info.session_id, info.id
            return None
        return ModelError(info.session_id, info.id, exc)
