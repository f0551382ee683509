"""One run: the session lease, start-up by mode, recovery, and the step loop — orchestration.

The parts do the work: :func:`~we0nb.engine.step.run_step` runs one model step with
:class:`~we0nb.engine.processor.StepProcessor` (the model stream into parts),
:class:`~we0nb.engine.executor.ToolExecutor` carries out what
:func:`~we0nb.engine.recovery.decide` decides for each call (write-ahead, interrupt, reconcile…),
:class:`~we0nb.engine.writer.Writer` decides when things become durable, and
:class:`~we0nb.engine.compaction.Compactor` summarises an overflowing history. They share one
:class:`~we0nb.engine.state.RunState`. A consumer that composes runs (a batch) passes
:class:`RunOptions`; the run knows nothing of what composes it.

Endings: a finished turn yields ``finish``; an abort persists what was produced, closes
nothing and raises :class:`asyncio.CancelledError`; any other exception is raised after
what was produced is written (unless the run lost its lease: then nothing more is written).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Optional

from .._ids import now
from .._text import clean
from ..errors import MaxStepsExceeded, ModelError, SessionBusyError
from ..messages import (
    UNFINISHED_MESSAGE,
    UNFINISHED_REASON,
    AssistantMessage,
    MessageError,
    MessageTime,
    Session,
    SessionTime,
    ToolPart,
    snapshot,
    turn_pending,
)
from ..models.base import ReasoningDelta, TextDelta
from ..persistence.base import Lease
from .abort import Aborted, AbortScope, set_flag
from .compaction import Compactor
from .events import Event
from .executor import ToolExecutor
from .history import HistoryCache
from .left import closed, closing, wait_for_left_run
from .observe import observer_for
from .output import OutputChecker
from .processor import ModelStream
from .recovery import Situation
from .request import RunRequest, RunResult
from .revert import hidden_ids, visible_messages
from .state import AgentSettings, RunState
from .step import run_step
from .writer import Writer

__all__ = ["Run", "RunOptions"]

log = logging.getLogger("we0nb.engine")

_NOTHING: Any = object()

#: the model event that extends an open part of each type
_DELTA_OF: dict[str, type] = {"text": TextDelta, "reasoning": ReasoningDelta}


def _same(m: Any) -> Any:
    """The object itself (events of a run with ``live_parts``)."""
    return m


@dataclass(frozen=True)
class RunOptions:
    """How a run is driven, for a consumer that composes runs (a batch item); the defaults are
    what :meth:`~we0nb.We0Agent.stream` and :meth:`~we0nb.We0Agent.invoke` use.

    ``live_parts``: events carry the live parts and messages instead of copies — for a
    consumer that reads each event at once and keeps none of them (a tenth of a step's CPU).

    ``pipelined``: on a store whose commits wait (:attr:`~we0nb.persistence.base.Persistence.
    commit_waits`), a step's start is committed while its model call goes out, and the step's
    first events come with the model's first event; a read-only call's ``running`` state is
    sent while the call runs (:meth:`~we0nb.engine.writer.Writer.write_ahead`); the session's
    lease is released in a task of its own, :attr:`Run.released`, which the consumer awaits —
    for a consumer that watches no run live. A crash before the step's start has landed is a
    crash before the step: nothing of the reply has been kept, yielded or acted on.

    ``after_last_call``: called once the turn needs the model no more, before the run's last
    commit (a batch slot starts its next item then, while this one's last writes go on).

    ``held``: the session's lease, taken for the request's ``run_id``, and the session as read
    with it (:meth:`~we0nb.persistence.base.Persistence.lease_and_session`), so the run starts
    without a round trip. The run owns the lease from then on: it releases it however it ends.
    """

    live_parts: bool = False
    pipelined: bool = False
    after_last_call: Optional[Callable[[], None]] = None
    held: Optional[tuple[Lease, Optional[Session]]] = None


class Run:
    """One run of the loop for one validated :class:`RunRequest`."""

    def __init__(self, agent: AgentSettings, request: RunRequest, *, structured: bool,
                 options: RunOptions = RunOptions()):
        self.agent = agent
        self.req = request
        self.p = agent.persistence
        self.structured = structured
        self.options = options
        self.pipelined = options.pipelined and agent.persistence.commit_waits and not agent.toolset.sources
        self.result: Optional[RunResult] = None
        #: a pipelined run's lease release, under way once the run has ended (None: not started,
        #: or released before the run ended)
        self.released: Optional["asyncio.Future[None]"] = None
        #: set while the run's consumer has left it and it is closing (see :mod:`.left`)
        self._left: Optional["asyncio.Future[None]"] = None
        self._stored: Optional[Session] = None  # the session as read with the lease
        held = options.held
        if held is not None and held[0].run_id != request.run_id:
            raise ValueError(f"the lease held was taken for run {held[0].run_id!r}, not this run's {request.run_id!r}")

    # ------------------------------------------------------------------ the run

    async def events(self) -> AsyncIterator[Event]:
        """The run as events.

        The model's stream is read here, in the consumer's own generator (see
        :class:`~we0nb.engine.processor.ModelStream`): a delta crosses nothing else. That is why
        this function is long — the delta path must not pass through another generator."""
        state = await self._begin()
        writer, scope, obs = state.writer, state.scope, state.observer
        aborted = set_flag(self.req.abort)  # (``aborted._value``: the event's own flag, no call)
        lease = writer.lease
        ended: Optional[BaseException] = None
        try:
            try:
                async for ev in self._run(state):
                    if not isinstance(ev, ModelStream):
                        if obs is not None:
                            obs.event(ev)
                        yield ev
                        continue
                    handed = ev
                    proc, read, task = handed.processor, handed.it.__anext__, scope.task
                    chunks, joiner = writer.chunks, proc.joiner
                    open_cls: Optional[type] = None  # (the delta class of the open part)
                    part_id, first = "", _NOTHING
                    half = False  # (the joiner holds a high surrogate: the next delta goes through it too)
                    try:
                        if handed.prelude is not None:  # (a pipelined step's start, once the model answered)
                            first = await self._first(handed)
                            async for out in handed.prelude:
                                if obs is not None:
                                    obs.event(out)
                                yield out
                        while True:
                            if first is _NOTHING:
                                if aborted._value:
                                    raise Aborted
                                scope.blocked = task
                                try:
                                    m = await read()
                                finally:
                                    scope.blocked = None
                            elif first is None:
                                break
                            else:
                                m, first = first, _NOTHING
                            cls = type(m)
                            if cls is not open_cls:  # (not a delta of the open part: rarely)
                                if cls is TextDelta or cls is ReasoningDelta:
                                    for out in await proc.open_part("text" if cls is TextDelta else "reasoning"):
                                        if obs is not None:
                                            obs.event(out)
                                        yield out
                                    open_cls, part_id = cls, writer.open.id  # type: ignore[union-attr]
                                else:
                                    for out in await proc.handle(m):
                                        if obs is not None:
                                            obs.event(out)
                                        yield out
                                    open_cls = None if writer.open is None else _DELTA_OF[writer.open.type]
                                    continue
                            text = m.text
                            if not text.isascii():
                                text = joiner.feed(text)
                                half = joiner.held != ""
                            elif half:  # (an ASCII delta after a held half: the half goes first)
                                text, half = joiner.feed(text), False
                            chunks.append(text)
                            if cls is TextDelta:
                                yield {"type": "text-delta", "text": text, "part_id": part_id}
                            else:
                                yield {"type": "reasoning-delta", "text": text, "part_id": part_id}
                            if writer.flush_due:
                                await writer.flush_open(close=False)
                    except StopAsyncIteration:
                        pass
                    except GeneratorExit:
                        raise
                    except BaseException as exc:  # (the processor finishes the step: it raises it there)
                        handed.error = exc
            except Aborted:
                await writer.persist_interrupted()  # (commits a held step end too)
                for ev in writer.take_held_events():  # its events, now that it is durable
                    if obs is not None:
                        obs.event(ev)
                    yield ev
                ended = asyncio.CancelledError("run aborted")
                raise ended from None
            except (asyncio.CancelledError, GeneratorExit) as exc:
                ended = exc
                if isinstance(exc, GeneratorExit) and lease is not None:  # (its consumer left: see .left)
                    self._left = closing(self.p, self.req.session_id)
                scope.uncancel()
                if not writer.lost:
                    await asyncio.shield(writer.persist_interrupted())
                raise
            except BaseException as exc:
                ended = exc
                await self._salvage(exc)
                raise
        finally:
            if obs is not None:
                obs.run_ended(ended)
            await self._end(scope, lease)

    async def _first(self, handed: ModelStream) -> Any:
        """The model's first event (None: the stream had none)."""
        try:
            return await self.state.scope.next(handed.it)
        except StopAsyncIteration:
            return None

    async def _begin(self) -> RunState:
        """The session's lease (taken now, or held already), the abort scope, the run's state."""
        req, held = self.req, self.options.held
        if req.abort.is_set():
            if held is not None:
                await held[0].release()
            raise asyncio.CancelledError("aborted before the run started")
        if held is not None:
            lease, self._stored = held
        else:
            try:
                lease, self._stored = await self.p.lease_and_session(req.session_id, req.run_id)
            except SessionBusyError:
                if not await wait_for_left_run(self.p, req.session_id):
                    raise
                lease, self._stored = await self.p.lease_and_session(req.session_id, req.run_id)
        scope = AbortScope(req.abort)
        scope.start()
        writer = Writer(self.p, lease, self.agent.flush_interval, pipelined=self.pipelined)
        self.state = RunState(self.agent, req, writer, scope, self.agent.toolset.table,
                              snap=_same if self.options.live_parts else snapshot,
                              observer=observer_for(self.agent, req))
        return self.state

    async def _end(self, scope: AbortScope, lease: Optional[Lease]) -> None:
        scope.close()
        self.state.writer.stop_flush_clock()
        if lease is None:
            return
        left = self._left
        if self.pipelined:
            self.released = asyncio.ensure_future(lease.release())
            if left is not None:
                self.released.add_done_callback(lambda _: closed(self.p, self.req.session_id, left))
            return
        try:
            await lease.release()  # (in this task: a store that answers at once costs no trip through the loop)
        finally:
            if left is not None:
                closed(self.p, self.req.session_id, left)

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
            exc.add_note(f"(we0nb could not write the run's last state either: {type(e).__name__}: {e})")

    async def _run(self, state: RunState) -> AsyncIterator["Event | ModelStream"]:
        req, agent, writer = self.req, self.agent, state.writer
        output = OutputChecker(state, self.structured)
        executor = ToolExecutor(state, output)
        compactor = Compactor(state)
        await state.refresh_tools()  # MCP servers connect here, before anything is written
        await agent.model.prepare()  # (a model's own start-up, e.g. a replay's recording: before any write)
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
                state.scope.check()  # (an abort set while recovery's events were read: no step)
            if executor.awaiting:  # a person decides first: no model call until then
                break
            if not self._needs_step(recovered, output):
                break
            if state.steps >= agent.max_steps:
                for ev in await writer.commit_held():
                    yield ev
                raise MaxStepsExceeded(req.session_id, agent.max_steps)
            try:
                async for item in run_step(state, executor, output):
                    yield item
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
        if self.options.after_last_call is not None:
            self.options.after_last_call()
        if writer.writes_anything():  # (a run that wrote nothing, e.g. a resume of a finished turn, leaves the session alone)
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
            cost=state.cost,
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
        if self.req.mode == "prompt":  # (a resume of a session the store does not hold writes nothing)
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

    async def _start_prompt(self, session: Session, executor: ToolExecutor) -> AsyncIterator[Event]:
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

    async def _recover(self, situation: Situation, executor: ToolExecutor) -> AsyncIterator[Event]:
        """Recover the last assistant message: its calls as :mod:`.recovery` decides, carried
        out by the executor, then the message closed if it never was."""
        state = self.state
        executor.awaiting = []
        last = state.last_assistant()
        if last is None or not last.unfinished:
            return
        info = last.info
        assert isinstance(info, AssistantMessage)
        completed = info.time.completed is not None
        async for ev in executor.recover(last.tool_parts, situation, completed=completed):
            yield ev
        if not completed:
            info.time = MessageTime(created=info.time.created, completed=now())
            if info.error is None:
                info.error = MessageError(reason=UNFINISHED_REASON, message=UNFINISHED_MESSAGE,
                                          metadata={"recovered": True, "mode": situation})
            await state.writer.write(info, final=last)
            yield {"type": "recovery", "action": "close", "message": snapshot(info)}
        state.history.invalidate()

    def _needs_step(self, recovered: bool, output: OutputChecker) -> bool:
        """Whether the turn goes on with a model step (the transcript's own rule, see turn_pending)."""
        messages = self.state.messages
        if not messages:
            return False
        if output.stored(messages[-1]):  # the turn already ended with its structured output
            return False
        return recovered or turn_pending(messages)
