"""The run loop: start-up by mode, recovery, model steps, tools — and every write.

The loop is the only writer during a run (it holds the session lease), so write-ahead
ordering lives here and only here:

* an assistant message is written at step start with ``time.completed = None``;
* a tool part is written as ``running`` *before* its tool executes, and again when it ends;
* streamed text is written on a bounded interval, and at part end, abort and step end.

Abort costs nothing per delta: a watcher task waits on the abort event and cancels the
run's task only while the run is blocked on the model or a tool; between those points the
loop checks ``abort.is_set()``. Either way the loop persists what it has, leaves
unfinished things unfinished, and raises :class:`asyncio.CancelledError`.
"""

from __future__ import annotations

import asyncio
import time as _time
from typing import TYPE_CHECKING, Any, AsyncIterator, Optional, Union

from pydantic import ValidationError

from .._ids import new_id, now
from ..errors import MaxStepsExceeded, ModelError, OutputValidationError
from ..messages import (
    UNFINISHED_MESSAGE,
    UNFINISHED_REASON,
    AssistantMessage,
    MessageError,
    MessageTime,
    MessageWithParts,
    Part,
    PartTime,
    ReasoningPart,
    Session,
    SessionTime,
    StepFinishPart,
    StepStartPart,
    TextPart,
    ToolPart,
    ToolStateCompleted,
    ToolStateError,
    ToolStatePending,
    ToolStateRunning,
    ToolTime,
    Transcript,
    Usage,
    UserMessage,
)
from ..models.base import FinishEvent, ModelRequest, ReasoningDelta, TextDelta, ToolCallEvent
from ..tools import ToolInputError, ToolPolicy, to_output
from .compaction import Compactor
from ..models.view import dump_view
from .history import HistoryCache, convert
from .recovery import block_after, needs_recovery, plan_recovery
from .revert import hidden_ids, visible_messages
from .request import RunRequest, RunResult

if TYPE_CHECKING:  # pragma: no cover
    from .agent import We0Agent

__all__ = ["Run", "interrupted", "OUTPUT_TOOL_RESULT"]

OUTPUT_TOOL_RESULT = "Final result processed."

_INTERRUPT_TEXT = {
    "resume": "Interrupted during recovery: this call never finished and was not run again "
              "(its tool may have side effects, or an earlier call blocked it); its outcome is unknown.",
    "prompt": "Interrupted: a new user message arrived before this call finished; it was not run again.",
    "blocked": "Not executed: an earlier call in this step failed and its tool blocks the calls after it.",
}


def interrupted(state: Any, reason: str) -> ToolStateError:
    """The final state of a call that was stopped without a result."""
    start = state.time.start if isinstance(state, ToolStateRunning) else None
    return ToolStateError(
        input=state.input,
        error=_INTERRUPT_TEXT[reason],
        metadata={"interrupted": True, "reason": reason},
        time=ToolTime(start=start, end=now()),
    )


_DELTA_KINDS = {TextDelta: ("text", "text-delta"), ReasoningDelta: ("reasoning", "reasoning-delta")}


def _snapshot(part: Part) -> Part:
    # states are replaced, never mutated, so a shallow copy is a faithful snapshot
    return part.model_copy()


class _Aborted(Exception):
    """Internal: the abort event was seen at a check point."""


class Run:
    """One run of the loop for one validated :class:`RunRequest`."""

    def __init__(self, agent: "We0Agent", request: RunRequest, *, structured: bool):
        self.agent = agent
        self.req = request
        self.p = agent.persistence
        self.structured = structured
        self.session_id = request.session_id
        self.messages: list[MessageWithParts] = []
        self.history = HistoryCache()
        self.steps = 0
        self.usage = Usage()
        self.output: Any = None
        self.has_output = False
        self.output_errors = 0
        self.result: Optional[RunResult] = None
        self._blocked_task: Optional[asyncio.Task] = None
        self._cancelled_by_abort = False
        self._open: Optional[Union[TextPart, ReasoningPart]] = None
        self._chunks: list[str] = []
        self._dirty: dict[str, Part] = {}
        self._last_flush = 0.0
        self._parent: Optional[str] = None
        # a finished step's end, committed with the next write (see _step); its events wait
        # for that commit
        self._end: Optional[tuple[AssistantMessage, tuple[Part, ...], MessageWithParts]] = None
        self._end_events: list[dict[str, Any]] = []
        self.compactor = Compactor(self)

    # ------------------------------------------------------------------ abort plumbing

    def _on_abort(self, fut: "asyncio.Future[Any]") -> None:
        if fut.cancelled():
            return
        task = self._blocked_task
        if task is not None and not task.done():
            self._cancelled_by_abort = True
            task.cancel()

    def _check_abort(self) -> None:
        if self.req.abort.is_set():
            raise _Aborted

    async def _blocking(self, aw: Any) -> Any:
        """Await ``aw`` (a model read or a tool) so that an abort cancels it at once."""
        self._blocked_task = asyncio.current_task()
        try:
            return await aw
        finally:
            self._blocked_task = None

    # ------------------------------------------------------------------ persistence helpers

    def view_of(self, m: MessageWithParts) -> Optional[str]:
        """A final message's model view, for a store that keeps them (else None: not made)."""
        return dump_view(convert(m)) if self.p.keeps_views else None

    async def _write(self, message: Optional[AssistantMessage], *parts: Part,
                     final: Optional[MessageWithParts] = None) -> None:
        """Write ``message`` and ``parts`` with every part not written yet, in one transaction.

        ``final``: the message is final with this write; its model view goes with it.
        """
        dirty = self._dirty
        for part in parts:
            dirty.pop(part.id, None)
        if dirty:
            parts = (*dirty.values(), *parts)
            dirty.clear()
        view = self.view_of(final) if final is not None else None
        end = self._end
        if end is not None:  # the previous step's end goes first, in the same transaction
            self._end = None
            await self.p.upsert_batch(message, parts, view=view, before=(end[0], end[1], self.view_of(end[2])))
        elif message is None and len(parts) == 1:
            await self.p.upsert_part(parts[0])
        elif message is not None or parts:
            await self.p.upsert_batch(message, parts, view=view)

    async def _write_part(self, part: Part) -> None:
        await self._write(None, part)

    def _materialize(self) -> None:
        part = self._open
        if part is not None and self._chunks:
            part.text = part.text + "".join(self._chunks)
            self._chunks = []

    async def _flush_open(self, close: bool) -> Optional[Part]:
        """Write the open text/reasoning part; with ``close`` also end it."""
        part = self._open
        if part is None:
            return None
        self._materialize()
        if close:
            part.time = PartTime(start=part.time.start if part.time else now(), end=now())
            self._open = None
        await self._write_part(part)
        self._last_flush = _time.monotonic()
        return part

    async def _commit_end(self) -> AsyncIterator[dict[str, Any]]:
        """Commit a pending step end now (the run goes no further) and yield its events."""
        if self._end is not None:
            await self._write(None)
        events, self._end_events = self._end_events, []
        for ev in events:
            yield ev

    async def _persist_interrupted_run(self) -> None:
        """On abort/cancel: write what was produced, close nothing."""
        self._materialize()
        if self._open is not None:
            self._dirty[self._open.id] = self._open
        await self._write(None)
        await self.p.flush()

    # ------------------------------------------------------------------ the run

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        """The run as events. Deltas cross only this generator and :meth:`_step`: keep it flat."""
        req, agent = self.req, self.agent
        if req.abort.is_set():
            raise asyncio.CancelledError("aborted before the run started")
        lease = await self.p.acquire_lease(req.session_id, req.run_id)
        watcher = asyncio.ensure_future(req.abort.wait())
        watcher.add_done_callback(self._on_abort)
        task = asyncio.current_task()
        try:
            try:
                session = await self._ensure_session()
                yield {"type": "start", "session_id": req.session_id, "mode": req.mode, "run_id": req.run_id}
                if session.revert is None:
                    # the older messages as stored model views, the recent ones as objects
                    recent = await self.p.load_recent(req.session_id)
                    self.messages = recent.messages
                    self.history = HistoryCache(recent.earlier)
                else:  # a revert point: its handling needs every message as an object
                    transcript: Transcript = await self.p.load_transcript(req.session_id)
                    self.messages = transcript.messages
                    if req.mode == "resume":
                        self.messages = visible_messages(session, self.messages)  # resume never sees reverted messages
                if req.mode == "prompt":
                    if session.revert is not None:
                        await self._clear_revert(session)
                    async for ev in self._recover("prompt"):
                        yield ev
                    for u in req.messages or ():
                        m = await self.append_user_message(u.text)
                        yield {"type": "user-message", "message": m.info.model_copy(), "text": m.text}
                while True:
                    self._check_abort()
                    recovered = False
                    if req.mode == "resume":
                        async for ev in self._recover("resume"):
                            recovered = True
                            yield ev
                    if not self._needs_step(recovered):
                        async for ev in self._commit_end():
                            yield ev
                        break
                    if self.steps >= agent.max_steps:
                        async for ev in self._commit_end():
                            yield ev
                        raise MaxStepsExceeded(req.session_id, agent.max_steps)
                    try:
                        async for ev in self._step():
                            yield ev
                    except ModelError as exc:
                        if not await self.compactor.on_model_error(exc):  # a context overflow compacts
                            raise
                    if self.has_output:
                        break
                    try:
                        due = self.compactor.due()
                    except BaseException:
                        async for ev in self._commit_end():
                            yield ev
                        raise
                    if due:
                        async for ev in self._commit_end():
                            yield ev
                        async for ev in self.compactor.compact():
                            yield ev
                        break
                await self._touch_session(session)
                last = next((m for m in reversed(self.messages)
                             if m.info.role == "assistant" and not getattr(m.info, "summary", False)), None)
                self.result = RunResult(
                    result="compact" if self.compactor.compacted else "stop",
                    session_id=req.session_id,
                    text=last.text if last else "",
                    output=self.output if self.structured else None,
                    message_id=last.info.id if last else None,
                    steps=self.steps,
                    usage=self.usage,
                    run_id=req.run_id,
                )
                yield {"type": "finish", "result": self.result}
            except _Aborted:
                await self._persist_interrupted_run()  # (commits a pending step end too)
                async for ev in self._commit_end():  # its events, now that it is durable
                    yield ev
                raise asyncio.CancelledError("run aborted") from None
            except (asyncio.CancelledError, GeneratorExit):
                if self._cancelled_by_abort and task is not None and hasattr(task, "uncancel"):
                    task.uncancel()
                await asyncio.shield(self._persist_interrupted_run())
                raise
        finally:
            if self._end is not None:  # an error left a step's end unwritten: write it
                try:
                    await asyncio.shield(self._write(None))
                except Exception:  # the store failing again must not hide the first error
                    pass
            watcher.remove_done_callback(self._on_abort)
            if not watcher.done():
                watcher.cancel()
            await asyncio.shield(lease.release())

    # ------------------------------------------------------------------ start-up

    async def _ensure_session(self) -> Session:
        s = await self.p.get_session(self.session_id)
        if s is None:
            t = now()
            first = self.req.messages[0].text.strip() if self.req.messages else ""
            title = first.splitlines()[0][:80] if first else ""
            s = Session(id=self.session_id, title=title, time=SessionTime(created=t, updated=t))
            await self.p.upsert_session(s)
        return s

    async def _touch_session(self, session: Session) -> None:
        # the lease makes this run the session's only writer, so ``session`` is current
        session.time = SessionTime(created=session.time.created, updated=now())
        await self.p.upsert_session(session)

    async def _clear_revert(self, session: Session) -> None:
        """Prompt mode: messages hidden by a revert are deleted for good."""
        assert session.revert is not None
        doomed = hidden_ids(session, self.messages)
        if doomed:
            await self.p.delete_messages(self.session_id, doomed)
            gone = set(doomed)
            self.messages = [m for m in self.messages if m.info.id not in gone]
        session.revert = None
        await self.p.upsert_session(session)
        self.history.invalidate()

    async def append_user_message(self, text: str, *, synthetic: bool = False) -> MessageWithParts:
        """Write a user message (and its text part) and make it the turn's parent."""
        t = now()
        info = UserMessage(id=new_id("msg"), session_id=self.session_id, time=MessageTime(created=t))
        part = TextPart(id=new_id("prt"), session_id=self.session_id, message_id=info.id, text=text,
                        time=PartTime(start=t, end=t), synthetic=synthetic)
        m = MessageWithParts.model_construct(info=info, parts=[part])
        await self.p.upsert_batch(info, [part], view=self.view_of(m))
        self.messages.append(m)
        self._parent = info.id
        return m

    # ------------------------------------------------------------------ recovery

    def _policies(self) -> dict[str, ToolPolicy]:
        pol = {name: t.policy for name, t in self.agent.tools_by_name.items()}
        if self.agent.output_type is not None:
            pol[self.agent.output_tool_name] = ToolPolicy(side_effects=False)
        return pol

    def _parent_id(self) -> Optional[str]:
        """The user message this turn answers (cached: found once, then kept by the writer)."""
        if self._parent is None:
            self._parent = next((m.info.id for m in reversed(self.messages) if m.info.role == "user"), None)
        return self._parent

    def _last_assistant(self) -> Optional[MessageWithParts]:
        for m in reversed(self.messages):
            if m.info.role == "assistant":
                return m
        return None

    async def _recover(self, mode: str) -> AsyncIterator[dict[str, Any]]:
        last = self._last_assistant()
        if last is None or not needs_recovery(last.info, last.parts):  # type: ignore[arg-type]
            return
        plan = plan_recovery(last.info, last.parts, self._policies(), mode)  # type: ignore[arg-type]
        by_id = {p.id: p for p in last.parts}
        i = 0
        while i < len(plan.tool_actions):
            action = plan.tool_actions[i]
            part = by_id[action.part_id]
            assert isinstance(part, ToolPart)
            if action.action == "keep":
                yield {"type": "recovery", "action": "keep", "part": _snapshot(part)}
            elif action.action == "interrupt":
                part.state = interrupted(part.state, action.reason or mode)
                await self._write_part(part)
                yield {"type": "recovery", "action": "interrupt", "part": _snapshot(part)}
                yield {"type": "tool", "part": _snapshot(part)}
            else:
                yield {"type": "recovery", "action": "recall", "part": _snapshot(part)}
                async for ev in self._execute(part, recalled=True):
                    yield ev
                if part.state.status == "error" and self._blocks(part.tool):
                    plan = block_after(plan, i)
            i += 1
        if plan.close_message:
            info = last.info
            assert isinstance(info, AssistantMessage)
            info.time = MessageTime(created=info.time.created, completed=now())
            if info.error is None:
                info.error = MessageError(reason=UNFINISHED_REASON, message=UNFINISHED_MESSAGE,
                                          metadata={"recovered": True, "mode": mode})
            await self._write(info, final=last)
            yield {"type": "recovery", "action": "close", "message": info.model_copy()}
        self.history.invalidate()

    def _blocks(self, tool_name: str) -> bool:
        t = self.agent.tools_by_name.get(tool_name)
        return bool(t and t.policy.blocks_on_error)

    # ------------------------------------------------------------------ step decision

    def _needs_step(self, recovered: bool) -> bool:
        if not self.messages:
            return False
        last = self.messages[-1]
        if last.info.role == "user":
            return True
        out_name = self.agent.output_tool_name if self.agent.output_type is not None else None
        tools = [p for p in last.parts if isinstance(p, ToolPart)]
        if out_name is not None:
            for p in tools:
                if p.tool == out_name and p.state.status == "completed":
                    self._take_output(p)
                    return False
        if getattr(last.info, "summary", False):
            return False
        return recovered or bool(tools)

    def _take_output(self, part: ToolPart) -> None:
        try:
            self.output = self.agent.output_adapter.validate_python(part.state.input)
            self.has_output = True
        except ValidationError:  # pragma: no cover - a completed output part was validated before
            pass

    # ------------------------------------------------------------------ one step

    def _model_request(self) -> ModelRequest:
        agent = self.agent
        return ModelRequest(
            messages=self.history.build(self.messages),
            tools=list(agent.tool_schemas),
            system=agent.system_prompt,
            output_tool=agent.output_tool_name if agent.output_type is not None else None,
        )

    async def _step(self) -> AsyncIterator[dict[str, Any]]:
        agent, p, sid = self.agent, self.p, self.session_id
        self.steps += 1
        parent = self._parent_id()
        t0 = now()
        info = AssistantMessage(id=new_id("msg"), session_id=sid, time=MessageTime(created=t0),
                                parent_id=parent, model_id=agent.model.model_id)
        msg = MessageWithParts.model_construct(info=info, parts=[])
        request = self._model_request()
        self.messages.append(msg)
        start = StepStartPart(id=new_id("prt"), session_id=sid, message_id=info.id, time=t0)
        msg.parts.append(start)
        # durability point: the unfinished message exists (committed with the previous step's end)
        await self._write(info, start)
        if self._end_events:
            events, self._end_events = self._end_events, []
            for ev in events:
                yield ev
            if self.req.abort.is_set():
                # aborted on the previous step's end: as if this step had not started
                await p.delete_messages(sid, [info.id])
                self.messages.pop()
                self.steps -= 1
                raise _Aborted
        yield {"type": "step-start", "step": self.steps, "message": info.model_copy()}

        finish = FinishEvent()
        parts = msg.parts
        interval = agent.flush_interval
        monotonic = _time.monotonic
        self._last_flush = monotonic()
        stream = None
        try:
            stream = agent.model.stream(request)
            it = stream.__aiter__()
            task = asyncio.current_task()
            while True:
                if self.req.abort.is_set():
                    raise _Aborted
                self._blocked_task = task
                try:
                    ev = await it.__anext__()
                except StopAsyncIteration:
                    break
                finally:
                    self._blocked_task = None
                cls = type(ev)
                if cls is TextDelta or cls is ReasoningDelta:
                    kind, delta_type = _DELTA_KINDS[cls]
                    part = self._open
                    if part is None or part.type != kind:
                        if part is not None:
                            closed = await self._flush_open(close=True)
                            yield {"type": f"{closed.type}-end", "part": _snapshot(closed)}  # type: ignore[union-attr]
                        ptype = TextPart if kind == "text" else ReasoningPart
                        part = ptype(id=new_id("prt"), session_id=sid, message_id=info.id, time=PartTime(start=now()))
                        parts.append(part)
                        self._open = part
                        await self._write_part(part)
                        yield {"type": f"{kind}-start", "part": _snapshot(part)}
                    self._chunks.append(ev.text)
                    yield {"type": delta_type, "text": ev.text, "part_id": part.id}
                    if monotonic() - self._last_flush >= interval:
                        await self._flush_open(close=False)
                elif cls is ToolCallEvent:
                    if self._open is not None:
                        closed = await self._flush_open(close=True)
                        yield {"type": f"{closed.type}-end", "part": _snapshot(closed)}  # type: ignore[union-attr]
                    raw = ev.input
                    state = (ToolStatePending(input=raw) if isinstance(raw, dict)
                             else ToolStatePending(input={}, raw=str(raw)))
                    tp = ToolPart(id=new_id("prt"), session_id=sid, message_id=info.id,
                                  call_id=ev.call_id, tool=ev.name, state=state)
                    parts.append(tp)
                    # pending is not a durability point: written with the first of its
                    # running write-ahead, the end of the stream, an abort or the step's end
                    self._dirty[tp.id] = tp
                    yield {"type": "tool", "part": _snapshot(tp)}
                elif cls is FinishEvent:
                    finish = ev
                else:
                    raise TypeError(f"The model streamed an unknown event {ev!r}.")
        except (_Aborted, asyncio.CancelledError, GeneratorExit):
            await self._close_stream(stream)
            raise
        except Exception as exc:
            await self._close_stream(stream)
            self._materialize()
            if self._open is not None:
                self._dirty[self._open.id] = self._open
                self._open = None
            info.error = MessageError(reason=type(exc).__name__, message=str(exc) or repr(exc),
                                      metadata={"step": self.steps})
            await self._write(info)
            await p.flush()
            raise ModelError(sid, info.id, exc) from exc
        if self._open is not None:
            closed = await self._flush_open(close=True)
            yield {"type": f"{closed.type}-end", "part": _snapshot(closed)}  # type: ignore[union-attr]

        # tools, one at a time, in the order the model emitted them
        # (the last call's end state is committed with the step's end, right after it)
        tools = [x for x in parts if isinstance(x, ToolPart)]
        blocked = False
        for i, tp in enumerate(tools):
            self._check_abort()
            last = i == len(tools) - 1
            if blocked:
                tp.state = interrupted(tp.state, "blocked")
                if last:
                    self._dirty[tp.id] = tp
                else:
                    await self._write_part(tp)
                    yield {"type": "tool", "part": _snapshot(tp)}
                continue
            async for ev2 in self._execute(tp, recalled=False, defer_final=last):
                yield ev2
            if tp.state.status == "error" and self._blocks(tp.tool):
                blocked = True

        self._check_abort()
        self.usage = self.usage + finish.usage
        end = now()
        sf = StepFinishPart(id=new_id("prt"), session_id=sid, message_id=info.id, reason=finish.reason,
                            usage=finish.usage, time=end)
        parts.append(sf)
        info.time = MessageTime(created=info.time.created, completed=end)
        info.finish_reason = finish.reason
        info.usage = finish.usage
        end_events = [{"type": "tool", "part": _snapshot(tools[-1])}] if tools else []
        end_events.append({"type": "step-finish", "step": self.steps, "message": info.model_copy(),
                           "finish_reason": finish.reason, "usage": finish.usage})
        if agent.output_type is None:
            # durability point: the step's end (with any part not written yet) — committed with
            # whatever the loop writes next, at once: the next step's start, or the run's end
            # (_commit_end). Nothing is yielded or run before that commit, and its events wait
            # for it, so a crash sees the same states as with a commit of its own, one fewer.
            self._end = (info, (*self._dirty.values(), sf), msg)
            self._dirty.clear()
            self._end_events = end_events
            return
        await self._write(info, sf, final=msg)
        for ev in end_events:
            yield ev
        self._after_output_errors(parts)

    async def _close_stream(self, stream: Any) -> None:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            try:
                await aclose()
            except BaseException:  # closing a broken stream must not hide the real error
                pass

    def _after_output_errors(self, parts: list[Part]) -> None:
        agent = self.agent
        if agent.output_type is None or self.has_output:
            return
        tools = [x for x in parts if isinstance(x, ToolPart)]
        if any(x.tool == agent.output_tool_name and x.state.status == "error" for x in tools):
            self.output_errors += 1
            if self.output_errors > agent.output_retries:
                raise OutputValidationError(
                    f"The model returned invalid structured output {self.output_errors} times "
                    f"(output_retries={agent.output_retries}) in session {self.session_id!r}. "
                    "The last error is in the transcript; adjust the prompt or output_type."
                )
        elif not tools and self.structured:
            raise OutputValidationError(
                f"The model ended its turn without calling {agent.output_tool_name!r} to return the "
                f"structured output ({agent.output_type!r}) in session {self.session_id!r}."
            )

    # ------------------------------------------------------------------ tool execution

    async def _execute(self, tp: ToolPart, *, recalled: bool,
                       defer_final: bool = False) -> AsyncIterator[dict[str, Any]]:
        """Run one call: validate, write ``running`` (write-ahead), run, write the end state.

        With ``defer_final`` the end state is left to the caller's next write — the step's
        end, which follows at once — so the last call of a step costs one commit less.
        """
        agent = self.agent
        state = tp.state
        inp = dict(state.input)
        raw = state.raw if isinstance(state, ToolStatePending) else None
        meta: dict[str, Any] = {"recalled": True} if recalled else {}
        is_output = agent.output_type is not None and tp.tool == agent.output_tool_name
        definition = agent.tools_by_name.get(tp.tool)
        start = now()
        if is_output:
            try:
                if raw is not None:
                    raise ValueError(f"the arguments are not a JSON object: {raw[:200]!r}")
                value = agent.output_adapter.validate_python(inp)
            except (ValidationError, ValueError) as e:
                tp.state = ToolStateError(input=inp, error=f"Invalid structured output: {e}. Fix it and call "
                                          f"{tp.tool!r} again.", metadata=meta, time=ToolTime(start=start, end=now()))
            else:
                tp.state = ToolStateCompleted(input=inp, output=OUTPUT_TOOL_RESULT, metadata=meta,
                                              time=ToolTime(start=start, end=now()))
                self.output = value
                self.has_output = True
        elif definition is None:
            names = ", ".join(sorted(agent.tools_by_name)) or "(none)"
            tp.state = ToolStateError(input=inp, error=f"Unknown tool {tp.tool!r}. Available tools: {names}.",
                                      metadata=meta, time=ToolTime(start=None, end=now()))
        else:
            try:
                kwargs = definition.validate_input(raw if raw is not None else inp)
            except ToolInputError as e:
                tp.state = ToolStateError(input=inp, error=str(e), metadata=meta,
                                          time=ToolTime(start=None, end=now()))
            else:
                tp.state = ToolStateRunning(input=inp, time=ToolTime(start=start))
                await self._write_part(tp)           # write-ahead: durable before the tool runs
                yield {"type": "tool", "part": _snapshot(tp)}
                self._check_abort()
                try:
                    if definition.is_async:
                        result = await self._blocking(definition.function(**kwargs))
                    else:
                        result = await self._blocking(asyncio.to_thread(definition.function, **kwargs))
                    output = to_output(result)
                except asyncio.CancelledError:
                    raise
                except Exception as e:
                    text = str(e) or type(e).__name__
                    tp.state = ToolStateError(input=inp, error=f"{type(e).__name__}: {text}" if str(e) else text,
                                              metadata=meta, time=ToolTime(start=start, end=now()))
                else:
                    tp.state = ToolStateCompleted(input=inp, output=output, metadata=meta,
                                                  time=ToolTime(start=start, end=now()))
        if defer_final:
            self._dirty[tp.id] = tp
            return
        await self._write_part(tp)
        yield {"type": "tool", "part": _snapshot(tp)}
