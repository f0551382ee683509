"""One run as spans: ``invoke_agent`` (the run), ``chat`` (each model call), ``execute_tool``.

:class:`RunTracer` is the run's :class:`~we0nb.engine.observe.RunObserver`. It reads only
what the run tells it — its events (what was made durable), each model stream's end and the
run's end — so a span says what happened, never what was planned:

* an ``execute_tool`` span opens when a call goes ``running`` in this run and ends with its
  final state (times taken from the part's own state). A call that is kept, interrupted,
  denied or reconciled never goes running in the run, so it gets no span; a recall does;
* a ``chat`` span starts when its step's message was created (before the call went out),
  ends when the model's stream ended, and carries the step's finish reason, usage and cost —
  known at the step's end, so the span is made then, with both times (one call to the
  tracing API instead of three: the SDK's cost is per call);
* recovery actions and approval requests are events on the run's span; an abort or a
  failure ends every open span with ``error.type`` and status ERROR.

Whatever the tracing API raises is logged once, every open span is ended, and the run
goes on untraced: telemetry never fails a run.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Optional

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from ..engine.abort import Aborted
from . import attributes as A
from .attributes import (CACHE_CREATION, CACHE_READ, COST, FINISH_REASONS, INPUT_TOKENS, OUTPUT_TOKENS, STEP,
                         TOOL_CALL_ID)

__all__ = ["RunTracer"]

log = logging.getLogger("we0nb.telemetry")

_ERROR = StatusCode.ERROR
_CLIENT, _INTERNAL = SpanKind.CLIENT, SpanKind.INTERNAL  # (an enum member's lookup is not free: once here)
_time_ns = time.time_ns

#: ``gen_ai.response.finish_reasons`` by we0nb's finish reason (a handful: made once each)
_REASONS: dict[Optional[str], tuple[str]] = {}


def _reasons(reason: Optional[str]) -> tuple[str]:
    found = _REASONS.get(reason)
    if found is None:
        found = _REASONS[reason] = (A.finish_reason(reason),)
    return found


def _ns(seconds: Optional[float]) -> Optional[int]:
    return None if seconds is None else int(seconds * 1e9)


class RunTracer:
    """The spans of one run (made by :func:`we0nb.telemetry.run_observer`).

    It guards itself (:attr:`guarded`): whatever the tracing API raises ends its watch, logged
    once, so the engine calls it without a guard of its own — its calls are per event."""

    #: it catches what it raises itself (see :func:`we0nb.engine.observe.observer_for`)
    guarded = True

    __slots__ = ("tracer", "agent", "content", "span", "ctx", "chat_attrs", "chat_name", "conversation",
                 "chat", "chat_end", "chat_finish", "tools", "outputs", "last_time", "quiet", "kinds")

    def __init__(self, tracer: Any, agent: Any, request: Any, agent_name: str) -> None:
        model = agent.model
        self.tracer = tracer
        self.agent = agent
        self.content: bool = agent.capture_content
        self.conversation = request.session_id
        provider, request_model = model.provider_name, model.request_model
        self.chat_attrs = {A.OPERATION: "chat", A.PROVIDER: provider, A.REQUEST_MODEL: request_model,
                           A.CONVERSATION: request.session_id}
        if model.server_address is not None:
            self.chat_attrs[A.SERVER_ADDRESS] = model.server_address
            if model.server_port is not None:
                self.chat_attrs[A.SERVER_PORT] = model.server_port
        self.chat_name = f"chat {request_model}"
        attrs = {A.OPERATION: "invoke_agent", A.AGENT_NAME: agent_name, A.CONVERSATION: request.session_id,
                 A.PROVIDER: provider, A.REQUEST_MODEL: request_model, A.RUN_MODE: request.mode,
                 A.RUN_ID: request.run_id}
        if self.content:
            attrs.update(_run_input(agent, request))
        self.span = tracer.start_span(f"invoke_agent {agent_name}", kind=_INTERNAL, attributes=attrs)
        self.ctx = trace.set_span_in_context(self.span)
        self.chat: Optional[tuple[float, int]] = None  # the model call under way: (its start in s, its step)
        self.chat_end: Optional[int] = None  # when its stream ended (ns)
        self.chat_finish: Any = None  # its finish event (the usage it reported), once it ended well
        self.tools: dict[str, Any] = {}  # part id → open execute_tool span
        self.outputs: list[dict[str, Any]] = []  # the step's output parts (content capture)
        self.last_time = time.time()
        #: it makes no more spans: the tracing API failed (see :meth:`_break`), or the run's span is
        #: not recorded — sampled out, or a no-op provider — so neither would its children be (a
        #: ``ParentBased`` sampler, the SDK's default, samples a child as its parent): nothing of
        #: the run is built for nobody
        self.quiet = not self.span.is_recording()
        self.kinds: dict[str, tuple[str, dict[str, Any]]] = {}  # tool → (span name, attributes) (per run)

    # ------------------------------------------------------------------ the observer

    def event(self, ev: Any) -> None:
        handler = _HANDLERS.get(ev["type"])
        if handler is None or self.quiet:
            return
        try:
            handler(self, ev)
        except Exception as e:
            self._break(e)

    def model_ended(self, step: int, error: Optional[BaseException], finish: Any = None) -> None:
        if error is None:  # (the usual case: its time, the span is made at the step's end)
            self.chat_end = _time_ns()
            self.chat_finish = finish
            return
        if self.quiet or self.chat is None:
            return
        try:
            self._chat_span({}, None, error)
            self.chat = None
        except Exception as e:
            self._break(e)

    def run_ended(self, error: Optional[BaseException]) -> None:
        if self.quiet:
            return
        try:
            if error is not None:
                self._close_open(error)
                self.span.set_attribute(A.RUN_RESULT, "aborted" if _is_abort(error) else "error")
                _fail(self.span, error, self.content)
            self.span.end()
        except Exception as e:
            self._break(e)

    # ------------------------------------------------------------------ events

    def _recovery(self, ev: Any) -> None:
        attrs: dict[str, Any] = {"we0nb.recovery.action": ev["action"]}
        part = ev.get("part")
        if part is not None:
            attrs[A.TOOL_NAME] = part.tool
            attrs[TOOL_CALL_ID] = part.call_id
        else:
            attrs["we0nb.message.id"] = ev["message"].id
        self.span.add_event("we0nb.recovery", attrs)

    def _step_start(self, ev: Any) -> None:
        self.chat = (ev["message"].time.created, ev["step"])
        self.chat_end = self.chat_finish = None
        if self.content:
            self.outputs = []

    def _chat_span(self, attrs: dict[str, Any], end: Optional[int], error: Optional[BaseException] = None) -> None:
        """The chat span of the model call under way, made whole: its attributes, start and end
        (one call to the tracing API: the SDK's cost is per call, and per attribute set later)."""
        assert self.chat is not None
        start, step = self.chat
        full = self.chat_attrs.copy()
        full[STEP] = step
        full.update(attrs)
        span = self.tracer.start_span(self.chat_name, context=self.ctx, kind=_CLIENT, attributes=full,
                                      start_time=int(start * 1e9))
        if error is not None:
            _fail(span, error, self.content)
        span.end(end_time=end)

    def _text_end(self, ev: Any) -> None:
        if self.content:
            self.outputs.append({"type": "text", "content": ev["part"].text})

    def _tool(self, ev: Any) -> None:
        part = ev["part"]
        st = part.state
        status = st.status
        if status == "running":
            self._tool_started(part, st)
        elif status == "pending":
            if self.content and self.chat is not None:
                self.outputs.append({"type": "tool_call", "id": part.call_id, "name": part.tool,
                                     "arguments": st.input})
        else:
            span = self.tools.pop(part.id, None)
            if span is not None:
                self._tool_ended(span, st)

    def _tool_started(self, part: Any, st: Any) -> None:
        known = self.kinds.get(part.tool)
        if known is None:
            known = self.kinds[part.tool] = (f"execute_tool {part.tool}", {
                A.OPERATION: "execute_tool", A.TOOL_NAME: part.tool, A.CONVERSATION: self.conversation,
                **_tool_kind(self.agent, part.tool)})
        attrs = known[1].copy()
        attrs[TOOL_CALL_ID] = part.call_id
        meta = st.metadata
        if meta:  # (a first attempt carries none: two lookups saved per call)
            if meta.get("recalled") is True:
                attrs["we0nb.tool.recalled"] = True
            attempt = meta.get("attempt")
            if isinstance(attempt, int) and attempt > 1:
                attrs["we0nb.tool.attempt"] = attempt
        if self.content:
            attrs[A.TOOL_ARGUMENTS] = A.as_json(st.input)
        begun = st.time.start
        self.tools[part.id] = self.tracer.start_span(known[0], context=self.ctx, kind=_INTERNAL, attributes=attrs,
                                                     start_time=None if begun is None else int(begun * 1e9))

    def _tool_ended(self, span: Any, st: Any) -> None:
        if st.status == "error":
            span.set_attribute(A.ERROR_TYPE, "interrupted" if st.metadata.get("interrupted") else "tool_error")
            span.set_status(Status(_ERROR, st.error[:300] if self.content else None))
            if self.content:
                span.set_attribute(A.TOOL_RESULT, st.error)
        elif self.content:
            span.set_attribute(A.TOOL_RESULT, st.output)
        done = st.time.end
        span.end(end_time=None if done is None else int(done * 1e9))

    def _step_finish(self, ev: Any) -> None:
        chat = self.chat
        if chat is None:
            return
        info = ev["message"]
        usage = ev["usage"]
        reasons = _reasons(ev["finish_reason"])
        # the chat span's attributes, in one dict given at its start (what usage_attributes makes, inline)
        attrs = self.chat_attrs.copy()
        attrs[STEP] = chat[1]
        attrs[INPUT_TOKENS] = usage.input_tokens
        attrs[OUTPUT_TOKENS] = usage.output_tokens
        if usage.cached_tokens:
            attrs[CACHE_READ] = usage.cached_tokens
        if usage.cache_write_tokens:
            attrs[CACHE_CREATION] = usage.cache_write_tokens
        cost = info.cost
        if cost is not None:
            attrs[COST] = cost
        attrs[FINISH_REASONS] = reasons
        if self.content:
            attrs[A.OUTPUT_MESSAGES] = A.as_json([{"role": "assistant", "parts": self.outputs,
                                                   "finish_reason": reasons[0]}])
        self.chat = None
        self.tracer.start_span(self.chat_name, context=self.ctx, kind=_CLIENT, attributes=attrs,
                               start_time=int(chat[0] * 1e9)).end(end_time=self.chat_end)
        self.last_time = info.time.completed or time.time()

    def _approval(self, ev: Any) -> None:
        part = ev["part"]
        self.span.add_event("we0nb.approval.request", {A.TOOL_NAME: part.tool, TOOL_CALL_ID: part.call_id})

    def _compaction(self, ev: Any) -> None:
        """The summary's model call: a chat span of its own (from the step before it to now)."""
        info = ev["message"]
        attrs = {**self.chat_attrs, "we0nb.compaction": True,
                 FINISH_REASONS: ("stop",), **A.usage_attributes(info.usage, info.cost)}
        if self.content:
            attrs[A.OUTPUT_MESSAGES] = A.as_json([{"role": "assistant", "finish_reason": "stop",
                                                   "parts": [{"type": "text", "content": ev["part"].summary}]}])
        span = self.tracer.start_span(self.chat_name, context=self.ctx, kind=_CLIENT, attributes=attrs,
                                      start_time=_ns(self.last_time))
        span.end(end_time=_ns(info.time.completed))

    def _finish(self, ev: Any) -> None:
        r = ev["result"]
        attrs: dict[str, Any] = {A.RUN_RESULT: r.result, "we0nb.run.steps": r.steps,
                                 **A.usage_attributes(r.usage, r.cost)}
        if r.finish_reason is not None:
            attrs[FINISH_REASONS] = _reasons(r.finish_reason)
        if r.approvals:
            attrs["we0nb.approvals.pending"] = len(r.approvals)
        if self.content and r.text:
            attrs[A.OUTPUT_MESSAGES] = A.as_json([{"role": "assistant", "finish_reason": A.finish_reason(r.finish_reason),
                                                   "parts": [{"type": "text", "content": r.text}]}])
        self.span.set_attributes(attrs)

    # ------------------------------------------------------------------ failures

    def _close_open(self, error: BaseException) -> None:
        """End the open chat and tool spans with ``error`` (an abort, a failure) — but a chat
        whose stream had ended well (its step was cut later, in a tool) ends as it did."""
        open_spans = list(self.tools.values())
        self.tools.clear()
        if self.chat is not None:
            if self.chat_end is not None:  # (the reply had ended: what it reported, as the step keeps it)
                self._chat_span(self._reported(), self.chat_end)
            else:
                self._chat_span({}, None, error)
            self.chat = None
        for span in open_spans:
            _fail(span, error, self.content)
            span.end()

    def _reported(self) -> dict[str, Any]:
        """The usage and cost a reply that ended well reported, for a step cut later (in its tools):
        the same figures the step's message keeps (``we0nb.engine.step._price``)."""
        finish, chat = self.chat_finish, self.chat
        if finish is None or chat is None:
            return {}
        from ..models.pricing import call_cost

        attrs = A.usage_attributes(finish.usage, call_cost(self.agent.model, finish.usage, chat[0]))
        attrs[FINISH_REASONS] = _reasons(finish.reason)
        return attrs

    def _break(self, e: Exception) -> None:
        """The tracing API failed: log it once, end what is open (best effort), trace no more."""
        self.quiet = True
        log.warning("tracing failed (%s: %s); this run goes on without spans", type(e).__name__, e)
        for span in [*self.tools.values(), self.span]:
            try:
                span.end()
            except Exception:
                pass
        self.tools.clear()
        self.chat = None


def _fail(span: Any, error: BaseException, content: bool) -> None:
    """``content``: the error's text may be shown (it can quote a prompt, an argument, a card
    number a tool was given); without it the span says only the error's type."""
    if _is_abort(error):  # (however the engine saw it, the run was aborted: what its caller sees)
        span.set_attribute(A.ERROR_TYPE, "CancelledError")
        span.set_status(Status(_ERROR, "aborted"))
        return
    span.set_attribute(A.ERROR_TYPE, A.error_type(error))
    span.set_status(Status(_ERROR, str(error)[:300] if content else None))


def _is_abort(error: BaseException) -> bool:
    return isinstance(error, (asyncio.CancelledError, GeneratorExit, Aborted))


def _tool_kind(agent: Any, name: str) -> dict[str, Any]:
    """``gen_ai.tool.type``, and the MCP client attributes for a tool of an MCP server."""
    definition = agent.toolset.table.by_name.get(name)
    server = getattr(definition, "server", None)
    if server is None:
        return {A.TOOL_TYPE: "function"}
    kind = getattr(server, "kind", None)
    attrs: dict[str, Any] = {A.TOOL_TYPE: "extension", "mcp.method.name": "tools/call",
                             "network.transport": "pipe" if kind == "stdio" else "tcp",
                             "we0nb.mcp.server": getattr(server, "label", "")}
    return attrs


def _run_input(agent: Any, request: Any) -> dict[str, Any]:
    """The run's input as content attributes: the system prompt and the user messages it writes."""
    attrs: dict[str, Any] = {}
    if agent.system_prompt:
        attrs[A.SYSTEM_INSTRUCTIONS] = A.as_json([{"type": "text", "content": agent.system_prompt}])
    if request.messages:
        attrs[A.INPUT_MESSAGES] = A.as_json([{"role": "user", "parts": [{"type": "text", "content": m.text}]}
                                             for m in request.messages])
    return attrs


_HANDLERS = {
    "recovery": RunTracer._recovery,
    "step-start": RunTracer._step_start,
    "text-end": RunTracer._text_end,
    "tool": RunTracer._tool,
    "step-finish": RunTracer._step_finish,
    "approval-request": RunTracer._approval,
    "compaction": RunTracer._compaction,
    "finish": RunTracer._finish,
}
