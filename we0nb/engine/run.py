"""One run: the session lease, start-up by mode, recovery, and the step loop — orchestration.

The parts do the work: :class:`~we0nb.engine.processor.StepProcessor` turns a model stream
into parts, :class:`~we0nb.engine.executor.ToolExecutor` runs the calls (write-ahead),
:class:`~we0nb.engine.writer.Writer` decides when things become durable,
:func:`~we0nb.engine.recovery.plan_recovery` decides keep/recall/interrupt, and
:class:`~we0nb.engine.compaction.Compactor` summarises an overflowing history. They share
one :class:`~we0nb.engine.state.RunState`.

Endings: a finished turn yields ``finish``; an abort persists what was produced, closes
nothing and raises :class:`asyncio.CancelledError`; any other exception is raised after
what was produced is written (unless the run lost its lease: then nothing more is written).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator, Callable, Optional

from .._ids import now
from .._text import clean
from ..errors import MaxStepsExceeded, ModelError
from ..messages import (
    UNFINISHED_MESSAGE,
    UNFINISHED_REASON,
    AssistantMessage,
    MessageError,
    MessageTime,
    MessageWithParts,
    Session,
    SessionTime,
    StepFinishPart,
    StepStartPart,
    ToolPart,
    snapshot,
    turn_pending,
)
from ..models.base import FinishEvent
from ..persistence.base import Lease
from .abort import Aborted, AbortScope
from .compaction import Compactor
from .executor import ToolExecutor, denied, interrupted
from .history import HistoryCache
from .output import OutputChecker
from .processor import StepProcessor
from .recovery import block_after, plan_recovery
from .request import RunRequest, RunResult
from .revert import hidden_ids, visible_messages
from .state import AgentSettings, RunState
from .writer import Writer

__all__ = ["Run"]

log = logging.getLogger("we0nb.engine")


def _same(m: Any) -> Any:
    """The object itself (events of a run made with ``copies=False``)."""
    return m


class Run:
    """One run of the loop for one validated :class:`RunRequest`."""

    def __init__(self, agent: AgentSettings, request: RunRequest, *, structured: bool, copies: bool = True,
                 pipelined: bool = False, after_last_call: Optional[Callable[[], None]] = None,
                 held: Optional[tuple[Lease, Optional[Session]]] = None):
        """``copies=False``: events carry the live parts and messages instead of copies — only
        for a consumer of this package that reads each event at once and keeps none of them
        (a batch item: it saves a tenth of a step's CPU).

        ``pipelined``: on a store whose commits wait (:attr:`~we0nb.persistence.base.Persistence.
        commit_waits`), a step's start is committed while its model call goes out, and the step's
        first events (the previous step's end, ``step-start``) come with the model's first event —
        for a consumer that watches no run live (a batch item: one commit's wait fewer per step).
        A crash before that commit has landed is a crash before the step: nothing of the reply
        has been kept, yielded or acted on. A read-only call's ``running`` state is sent while
        the call runs (:mod:`~we0nb.engine.executor`), and the session's lease is released in a
        task of its own, :attr:`released`, which the consumer awaits (so the release goes to the
        store with what the consumer sends next).

        ``after_last_call``: called once the turn needs the model no more, before the run's last
        commit (a batch slot starts its next item then, while this one's last writes go on).

        ``held``: the session's lease, taken for this request's ``run_id``, and the session as
        read with it (:meth:`~we0nb.persistence.base.Persistence.lease_and_session`) — a batch
        takes them for its next items before a slot needs one, so the run starts without a
        round trip. The run owns the lease from then on: it releases it however it ends."""
        self.agent = agent
        self.req = request
        self.p = agent.persistence
        self.structured = structured
        self.copies = copies
        self.pipelined = pipelined and agent.persistence.commit_waits and not agent.toolset.sources
        self.result: Optional[RunResult] = None
        self.after_last_call = after_last_call
        #: a pipelined run's lease release, under way once the run has ended (None: not started,
        #: or released before the run ended)
        self.released: Optional["asyncio.Future[None]"] = None
        self._stored: Optional[Session] = None  # the session as read with the lease
        if held is not None and held[0].run_id != request.run_id:
            raise ValueError(f"the lease held was taken for run {held[0].run_id!r}, not this run's {request.run_id!r}")
        self.held = held

    # ------------------------------------------------------------------ the run

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        """The run as events. Deltas cross only this generator and the processor's: keep it flat."""
        req = self.req
        if req.abort.is_set():
            if self.held is not None:
                await self.held[0].release()
            raise asyncio.CancelledError("aborted before the run started")
        if self.held is not None:
            lease, self._stored = self.held
        else:
            lease, self._stored = await self.p.lease_and_session(req.session_id, req.run_id)
        scope = AbortScope(req.abort)
        scope.start()
        writer = Writer(self.p, lease, self.agent.flush_interval)
        self.state = state = RunState(self.agent, req, writer, scope, self.agent.toolset.table,
                                      snap=snapshot if self.copies else _same, pipelined=self.pipelined)
        try:
            try:
                async for ev in self._run(state):
                    yield ev
            except Aborted:
                await writer.persist_interrupted()  # (commits a held step end too)
                for ev in writer.take_held_events():  # its events, now that it is durable
                    yield ev
                raise asyncio.CancelledError("run aborted") from None
            except (asyncio.CancelledError, GeneratorExit):
                scope.uncancel()
                if not writer.lost:
                    await asyncio.shield(writer.persist_interrupted())
                raise
            except BaseException as exc:
                await self._salvage(exc)
                raise
        finally:
            scope.close()
            if self.pipelined:
                self.released = asyncio.ensure_future(lease.release())
            else:
                await lease.release()  # (in this task: a store that answers at once costs no trip through the loop)

    async def _salvage(self, exc: BaseException) -> None:
        """A run that fails: write what it produced (a held step end, dirty parts), unless the
        lease is lost. A failure to write is logged and noted on ``exc``, never hiding it."""
        writer = self.state.writer
        if writer.lost:
            return
        try:
            await asyncio.shield(writer.persist_interrupted())
        except Exception as e:
            log.warning("writing the failed run's last state failed: %s: %s", type(e).__name__, e)
            if hasattr(exc, "add_note"):
                exc.add_note(f"(we0nb could not write the run's last state either: {type(e).__name__}: {e})")

    async def _run(self, state: RunState) -> AsyncIterator[dict[str, Any]]:
        req, agent, writer = self.req, self.agent, state.writer
        output = OutputChecker(state, self.structured)
        executor = ToolExecutor(state, output)
        compactor = Compactor(state)
        await state.refresh_tools()  # MCP servers connect here, before anything is written
        session, created = await self._ensure_session()
        yield {"type": "start", "session_id": req.session_id, "mode": req.mode, "run_id": req.run_id}
        await self._load(session, created)
        if req.mode == "prompt":
            async for ev in self._start_prompt(session, executor):
                yield ev
        while True:
            state.scope.check()
            recovered = False
            if req.mode == "resume":
                async for ev in self._recover("resume", executor):
                    recovered = True
                    yield ev
            if executor.awaiting:  # a person decides first: no model call until then
                break
            if not self._needs_step(recovered, output):
                break
            if state.steps >= agent.max_steps:
                for ev in await writer.commit_held():
                    yield ev
                raise MaxStepsExceeded(req.session_id, agent.max_steps)
            try:
                async for ev in self._step(executor, output):
                    yield ev
            except ModelError as exc:
                if not await compactor.on_model_error(exc):  # a context overflow compacts
                    raise
            if state.has_output or executor.awaiting:
                break
            try:
                due = compactor.due()
            except BaseException:
                for ev in await writer.commit_held():
                    yield ev
                raise
            if due:
                for ev in await writer.commit_held():
                    yield ev
                async for ev in compactor.compact():
                    yield ev
                break
        if self.after_last_call is not None:
            self.after_last_call()
        self._touch_session(session)
        for ev in await writer.commit_held():  # (the held step end, with the session's row)
            yield ev
        self.result = self._result(compactor.compacted, executor.awaiting)
        yield {"type": "finish", "result": self.result}

    def _result(self, compacted: bool, awaiting: list[ToolPart]) -> RunResult:
        state = self.state
        last = next((m for m in reversed(state.messages) if m.info.role == "assistant" and not m.is_summary), None)
        return RunResult(
            result="approval" if awaiting else "compact" if compacted else "stop",
            approvals=[snapshot(p) for p in awaiting],
            session_id=self.req.session_id,
            text=last.text if last else "",
            output=state.output if self.structured else None,
            message_id=last.info.id if last else None,
            steps=state.steps,
            usage=state.usage,
            run_id=self.req.run_id,
            finish_reason=last.info.finish_reason if last else None,  # type: ignore[union-attr]
        )

    # ------------------------------------------------------------------ start-up

    async def _ensure_session(self) -> tuple[Session, bool]:
        """The session (as read with the lease), and whether this run just created it."""
        s = self._stored
        if s is not None:
            return s, False
        t = now()
        first = self.req.messages[0].text.strip() if self.req.messages else ""
        title = first.splitlines()[0][:80] if first else ""
        s = Session(id=self.req.session_id, title=title, time=SessionTime(created=t, updated=t))
        self.state.writer.hold_session(s)  # (written with the run's first commit)
        return s, True

    async def _load(self, session: Session, created: bool) -> None:
        """The history the run starts from (older messages as stored model views when possible)."""
        state, sid = self.state, self.req.session_id
        if created:  # (a store shows no message of a session without its row: nothing to read)
            state.load([], HistoryCache())
            return
        if session.revert is None:
            recent = await self.p.load_recent(sid)
            state.load(recent.messages, HistoryCache(recent.earlier))
            return
        # a revert point: its handling needs every message as an object
        messages = (await self.p.load_transcript(sid)).messages
        state.load(messages, HistoryCache())  # (ids seeded from every message, hidden ones too)
        if self.req.mode == "resume":
            state.messages = visible_messages(session, messages)  # resume never sees reverted messages

    async def _start_prompt(self, session: Session, executor: ToolExecutor) -> AsyncIterator[dict[str, Any]]:
        """Prompt mode: clear a revert, interrupt what the last turn left unfinished, hold the messages."""
        if session.revert is not None:
            await self._clear_revert(session)
        async for ev in self._recover("prompt", executor):
            yield ev
        for u in self.req.messages or ():
            self.state.hold_user_message(clean(u.text))  # (committed with the first step's start)

    def _touch_session(self, session: Session) -> None:
        """The run's end time on the session, written with the run's last commit (the lease
        makes this run the session's only writer, so ``session`` is current)."""
        session.time = SessionTime(created=session.time.created, updated=now())
        self.state.writer.hold_session(session)

    async def _clear_revert(self, session: Session) -> None:
        """Prompt mode: messages hidden by a revert are deleted for good."""
        assert session.revert is not None
        state = self.state
        doomed = hidden_ids(session, state.messages)
        if doomed:
            await self.p.delete_messages(self.req.session_id, doomed)
            gone = set(doomed)
            state.messages = [m for m in state.messages if m.info.id not in gone]
        session.revert = None
        await self.p.upsert_session(session)
        state.history.invalidate()

    # ------------------------------------------------------------------ recovery

    async def _recover(self, mode: str, executor: ToolExecutor) -> AsyncIterator[dict[str, Any]]:
        """Apply the recovery plan to the last assistant message (see :mod:`.recovery`)."""
        state = self.state
        executor.awaiting = []
        last = state.last_assistant()
        if last is None or not last.unfinished:
            return
        plan = plan_recovery(last.info, last.parts, state.policies(), mode)  # type: ignore[arg-type]
        by_id = {p.id: p for p in last.parts}
        for i in range(len(plan.tool_actions)):
            action = plan.tool_actions[i]  # (read each time: a blocking error changes the plan)
            part = by_id[action.part_id]
            assert isinstance(part, ToolPart)
            async for ev in self._apply(action.action, action.reason or mode, part, executor):
                yield ev
            if action.action in ("recall", "execute") and part.state.status == "error" and state.blocks(part.tool):
                plan = block_after(plan, i)
        if plan.close_message:
            info = last.info
            assert isinstance(info, AssistantMessage)
            info.time = MessageTime(created=info.time.created, completed=now())
            if info.error is None:
                info.error = MessageError(reason=UNFINISHED_REASON, message=UNFINISHED_MESSAGE,
                                          metadata={"recovered": True, "mode": mode})
            await state.writer.write(info, final=last)
            yield {"type": "recovery", "action": "close", "message": snapshot(info)}
        state.history.invalidate()

    async def _apply(self, action: str, reason: str, part: ToolPart,
                     executor: ToolExecutor) -> AsyncIterator[dict[str, Any]]:
        """One row of the plan: keep, await, interrupt, deny, recall or execute the call."""
        writer = self.state.writer
        yield {"type": "recovery", "action": action, "part": snapshot(part)}
        if action == "await":
            if part.awaiting_approval:
                executor.awaiting.append(part)
        elif action in ("interrupt", "deny"):
            part.state = interrupted(part.state, reason) if action == "interrupt" else denied(part)
            await writer.write(None, part)
            yield {"type": "tool", "part": snapshot(part)}
        elif action in ("recall", "execute"):
            async for ev in executor.execute(part, recalled=action == "recall"):
                yield ev

    def _needs_step(self, recovered: bool, output: OutputChecker) -> bool:
        """Whether the turn goes on with a model step (the transcript's own rule, see turn_pending)."""
        messages = self.state.messages
        if not messages:
            return False
        if output.stored(messages[-1]):  # the turn already ended with its structured output
            return False
        return recovered or turn_pending(messages)

    # ------------------------------------------------------------------ one step

    async def _step(self, executor: ToolExecutor, output: OutputChecker) -> AsyncIterator[dict[str, Any]]:
        state, agent, writer = self.state, self.agent, self.state.writer
        sid = self.req.session_id
        state.steps += 1
        t0 = now()
        info = AssistantMessage(id=state.ids("msg"), session_id=sid, time=MessageTime(created=t0),
                                parent_id=state.parent_id(), model_id=agent.model.model_id)
        msg = MessageWithParts.model_construct(info=info, parts=[])
        request = state.model_request()
        state.messages.append(msg)
        start = StepStartPart(id=state.ids("prt"), session_id=sid, message_id=info.id, time=t0)
        msg.parts.append(start)
        # durability point: the unfinished message exists (committed with the previous step's end)
        if self.pipelined:  # (sent now; the processor waits for it before it uses the model's reply)
            writer.write_soon(info, start)
            processor = StepProcessor(state, msg, started=lambda: self._started(info, request))
        else:
            await writer.write(info, start)
            async for ev in self._started(info, request):
                yield ev
            processor = StepProcessor(state, msg)
        async for ev in processor.run(request):
            yield ev
        calls = msg.tool_parts
        async for ev in executor.run_step(calls):
            yield ev
        state.scope.check()
        if self.agent.output_type is None:
            # durability point: the step's end — committed with whatever the run writes next, at
            # once (the next step's start, or the run's end); nothing is yielded or run before it
            info, sf, events = self._close_step(msg, processor, calls)
            writer.hold(info, (sf,), msg, events)
            return
        async for ev in self._finish_step(msg, processor, calls, output):
            yield ev

    async def _started(self, info: AssistantMessage, request: Any) -> AsyncIterator[dict[str, Any]]:
        """Once the step's start is committed: the previous step's end events (now durable), then
        ``step-start``. An abort set by then (by the consumer of those events too) undoes the
        step, as if it had not started."""
        state, writer = self.state, self.state.writer
        await writer.settle()
        held = writer.take_held_events()
        if held:
            for ev in held:
                yield ev
            if state.scope.is_set:
                await self.p.delete_messages(self.req.session_id, [info.id])
                state.messages.pop()
                state.steps -= 1
                raise Aborted
        if state.steps > 1 and self.agent.toolset.sources:  # (after the commit above: it holds the last step's end)
            await state.refresh_tools()  # an MCP server's tools may have changed, or it restarted
            request.tools = list(state.tools.schemas)
        yield {"type": "step-start", "step": state.steps, "message": state.snap(info)}

    def _close_step(self, msg: MessageWithParts, processor: StepProcessor,
                    calls: list[ToolPart]) -> tuple[AssistantMessage, StepFinishPart, list[dict[str, Any]]]:
        """Close the step's message: its finish part, times and usage; the step end's events."""
        state = self.state
        info: AssistantMessage = msg.info  # type: ignore[assignment]
        finish = processor.finish or FinishEvent()
        state.usage = state.usage + finish.usage
        end = now()
        sf = StepFinishPart(id=state.ids("prt"), session_id=info.session_id, message_id=info.id,
                            reason=finish.reason, usage=finish.usage, time=end)
        msg.parts.append(sf)
        info.time = MessageTime(created=info.time.created, completed=end)
        info.finish_reason = finish.reason
        info.usage = finish.usage
        # the last call's end state is committed with the step's end: its event waits for it (a
        # call left pending behind an approval has not changed, so it has no new event)
        events: list[dict[str, Any]] = ([{"type": "tool", "part": state.snap(calls[-1])}]
                                        if calls and calls[-1].finished else [])
        events.append({"type": "step-finish", "step": state.steps, "message": state.snap(info),
                       "finish_reason": finish.reason, "usage": finish.usage})
        return info, sf, events

    async def _finish_step(self, msg: MessageWithParts, processor: StepProcessor, calls: list[ToolPart],
                           output: OutputChecker) -> AsyncIterator[dict[str, Any]]:
        """With an output type: the step's end is committed at once, then the output is checked."""
        info, sf, events = self._close_step(msg, processor, calls)
        writer = self.state.writer
        writer.hold(info, (sf,), msg, events)
        for ev in await writer.commit_held():  # (a text end held at the stream's end comes first)
            yield ev
        for ev in await output.after_step(msg):  # (an invalid answer: a message asking again)
            yield ev
