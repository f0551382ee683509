"""Runs as OpenTelemetry GenAI spans (issue 35, SPEC §13), read back from the SDK's in-memory
exporter: the span tree and its attributes, and the truths of resume, abort, approval and
batches — no ``execute_tool`` span for a call that was not executed in the run."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Iterator, Optional

import genai_prices.data  # noqa: F401  (its prices, imported here: not on the event loop under the blocking-call guard)
import pandas  # noqa: F401
import pytest
import tqdm.auto  # noqa: F401

pytest.importorskip("opentelemetry.sdk", reason="the tracing tests need opentelemetry-sdk (pip install opentelemetry-sdk)")

from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter, SpanExportResult  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace import SpanKind, StatusCode  # noqa: E402

import we0nb.telemetry  # noqa: E402,F401  (imported at collection: the first run would import it on the loop)
from we0nb import MemoryPersistence, Reconciled, ScriptedModel, We0Agent, tool, user_message  # noqa: E402
from we0nb.engine import observe  # noqa: E402
from we0nb.testing import fail, text, tool_call, usage  # noqa: E402

from enginekit import Log, make_tools, seed, state  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


class Traced:
    """A provider with an in-memory exporter, and the finished spans by kind."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))

    @property
    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, operation: str) -> list[ReadableSpan]:
        return [s for s in self.spans if (s.attributes or {}).get("gen_ai.operation.name") == operation]

    def one(self, operation: str) -> ReadableSpan:
        found = self.named(operation)
        assert len(found) == 1, [s.name for s in self.spans]
        return found[0]

    def clear(self) -> None:
        self.exporter.clear()


@pytest.fixture
def traced() -> Iterator[Traced]:
    t = Traced()
    yield t
    t.provider.shutdown()


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def parent_of(span: ReadableSpan) -> Optional[int]:
    return span.parent.span_id if span.parent is not None else None


@tool(side_effects=False)
def look(q: str) -> str:
    return f"seen {q}"


@tool(side_effects=False)
def broken(q: str) -> str:
    raise ValueError("no such thing")


# --------------------------------------------------------------------------- the span tree


async def test_a_run_is_an_invoke_agent_span_with_a_chat_span_per_call_and_a_tool_span_per_execution(traced) -> None:
    model = ScriptedModel([[tool_call("look", {"q": "a"}), tool_call("look", {"q": "b"}), usage(1000, 100, cached_tokens=200)],
                           [text("done"), usage(1500, 20)]], provider="openai", model_id="gpt-4o")
    agent = We0Agent(model, tools=[look], tracer_provider=traced.provider)
    result = await agent.invoke(session_id="s1", messages=[user_message("go")])

    run = traced.one("invoke_agent")
    assert run.name == "invoke_agent we0nb" and run.kind == SpanKind.INTERNAL and run.parent is None
    a = attrs(run)
    assert a["gen_ai.agent.name"] == "we0nb" and a["gen_ai.conversation.id"] == "s1"
    assert a["gen_ai.provider.name"] == "openai" and a["gen_ai.request.model"] == "gpt-4o"
    assert a["we0nb.run.mode"] == "prompt" and a["we0nb.run.result"] == "stop" and a["we0nb.run.id"] == result.run_id
    assert a["gen_ai.usage.input_tokens"] == 2500 and a["gen_ai.usage.cost"] == pytest.approx(result.cost)

    chats = sorted(traced.named("chat"), key=lambda s: s.start_time or 0)
    assert [c.name for c in chats] == ["chat gpt-4o"] * 2
    assert all(c.kind == SpanKind.CLIENT and parent_of(c) == run.context.span_id for c in chats)
    first, second = attrs(chats[0]), attrs(chats[1])
    assert first["gen_ai.response.finish_reasons"] == ("tool_call",) and second["gen_ai.response.finish_reasons"] == ("stop",)
    assert (first["gen_ai.usage.input_tokens"], first["gen_ai.usage.output_tokens"]) == (1000, 100)
    assert first["gen_ai.usage.cache_read.input_tokens"] == 200
    steps = [m.info for m in (await agent.transcript("s1")).messages if m.info.role == "assistant"]
    assert [first["gen_ai.usage.cost"], second["gen_ai.usage.cost"]] == [steps[0].cost, steps[1].cost]
    assert "server.address" not in first  # an offline model talks to no server

    tools = traced.named("execute_tool")
    parts = [p for p in (await agent.transcript("s1")).messages[1].parts if p.type == "tool"]
    assert sorted(attrs(t)["gen_ai.tool.call.id"] for t in tools) == sorted(p.call_id for p in parts)
    for t in tools:
        assert t.name == "execute_tool look" and t.kind == SpanKind.INTERNAL and parent_of(t) == run.context.span_id
        assert attrs(t)["gen_ai.tool.name"] == "look" and attrs(t)["gen_ai.tool.type"] == "function"
        assert t.status.status_code == StatusCode.UNSET
    # every span of the run is in one trace, timed within it
    assert {s.context.trace_id for s in traced.spans} == {run.context.trace_id}
    assert all(run.start_time <= s.start_time <= s.end_time <= run.end_time for s in traced.spans)  # type: ignore[operator]
    assert chats[0].end_time <= min(t.start_time for t in tools)  # type: ignore[operator]  (the stream ended first)


async def test_content_is_recorded_only_with_capture_content(traced) -> None:
    def run(capture: bool) -> Any:
        model = ScriptedModel([[tool_call("look", {"q": "secret-arg"})], [text("secret-answer")]])
        agent = We0Agent(model, tools=[look], tracer_provider=traced.provider, capture_content=capture,
                         system_prompt="secret-system")
        return agent.invoke(messages=[user_message("secret-prompt")])

    await run(False)
    everything = json.dumps([[attrs(s), [dict(e.attributes or {}) for e in s.events]] for s in traced.spans],
                            default=str)
    assert "secret" not in everything
    for key in ("gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.system_instructions",
                "gen_ai.tool.call.arguments", "gen_ai.tool.call.result"):
        assert key not in everything
    traced.clear()

    await run(True)
    run_attrs = attrs(traced.one("invoke_agent"))
    assert json.loads(run_attrs["gen_ai.input.messages"]) == [
        {"role": "user", "parts": [{"type": "text", "content": "secret-prompt"}]}]
    assert json.loads(run_attrs["gen_ai.system_instructions"]) == [{"type": "text", "content": "secret-system"}]
    assert json.loads(run_attrs["gen_ai.output.messages"])[0]["parts"] == [{"type": "text", "content": "secret-answer"}]
    t = attrs(traced.one("execute_tool"))
    assert json.loads(t["gen_ai.tool.call.arguments"]) == {"q": "secret-arg"} and t["gen_ai.tool.call.result"] == "seen secret-arg"
    outputs = [json.loads(attrs(c)["gen_ai.output.messages"]) for c in sorted(traced.named("chat"),
                                                                              key=lambda s: s.start_time or 0)]
    assert outputs[0][0]["parts"][0]["type"] == "tool_call" and outputs[0][0]["parts"][0]["name"] == "look"
    assert outputs[1][0]["parts"] == [{"type": "text", "content": "secret-answer"}]


@pytest.mark.parametrize("capture", [False, True])
async def test_an_errors_text_is_a_spans_status_only_with_capture_content(traced, capture) -> None:
    # the text of a failure can quote what a tool or a model was given (here a card number)
    model = ScriptedModel([[text("partial"), fail(RuntimeError("card 4111-1111 rejected"))]])
    agent = We0Agent(model, tracer_provider=traced.provider, capture_content=capture)
    with pytest.raises(Exception):
        await agent.invoke(messages=[user_message("go")])
    failed = [s for s in traced.spans if s.status.status_code == StatusCode.ERROR]
    assert {s.name for s in failed} == {"chat scripted", "invoke_agent we0nb"}
    assert {attrs(s)["error.type"] for s in failed} == {"RuntimeError", "ModelError"}  # (the type, always)
    texts = [s.status.description or "" for s in failed]
    assert all("4111" in t for t in texts) if capture else texts == ["", ""]


# --------------------------------------------------------------------------- failures


async def test_a_failed_tool_and_a_failed_model_call_set_error_type_and_status(traced) -> None:
    agent = We0Agent(ScriptedModel([[tool_call("broken", {"q": "a"})], [fail(RuntimeError("provider down"))]]),
                     tools=[broken], tracer_provider=traced.provider)
    with pytest.raises(Exception):
        await agent.invoke(messages=[user_message("go")])
    t = traced.one("execute_tool")
    assert t.status.status_code == StatusCode.ERROR and attrs(t)["error.type"] == "tool_error"
    failed = [c for c in traced.named("chat") if c.status.status_code == StatusCode.ERROR]
    assert len(failed) == 1 and attrs(failed[0])["error.type"] == "RuntimeError"
    run = traced.one("invoke_agent")
    assert run.status.status_code == StatusCode.ERROR and attrs(run)["we0nb.run.result"] == "error"
    assert attrs(run)["error.type"] in ("ModelError", "RuntimeError")


async def test_an_abort_ends_the_open_spans_with_error_type(traced) -> None:
    started = asyncio.Event()

    @tool(side_effects=False)
    async def slow(q: str) -> str:
        started.set()
        await asyncio.sleep(30)
        return "never"

    abort = asyncio.Event()
    agent = We0Agent(ScriptedModel([[tool_call("slow", {"q": "a"})], [text("x")]]), tools=[slow],
                     tracer_provider=traced.provider)

    async def cut() -> None:
        await started.wait()
        abort.set()

    cutter = asyncio.ensure_future(cut())
    with pytest.raises(asyncio.CancelledError):
        await agent.invoke(abort=abort, messages=[user_message("go")])
    await cutter
    t, run, chat = traced.one("execute_tool"), traced.one("invoke_agent"), traced.one("chat")
    for span in (t, run):
        assert span.status.status_code == StatusCode.ERROR and attrs(span)["error.type"] == "CancelledError"
    assert attrs(run)["we0nb.run.result"] == "aborted" and run.end_time is not None
    # the model call itself had ended well before the tool was cut: its span says so
    assert chat.status.status_code == StatusCode.UNSET and "error.type" not in attrs(chat)
    assert chat.end_time <= t.start_time  # type: ignore[operator]


async def test_a_step_cut_in_its_tool_keeps_its_calls_usage_and_cost_in_the_span_as_in_the_store(traced) -> None:
    started = asyncio.Event()

    @tool
    async def slow(q: str) -> str:
        started.set()
        await asyncio.sleep(30)
        return "never"

    abort = asyncio.Event()
    model = ScriptedModel([[tool_call("slow", {"q": "a"}), usage(1000, 100)]], provider="openai", model_id="gpt-4o")
    agent = We0Agent(model, tools=[slow], tracer_provider=traced.provider)

    async def cut() -> None:
        await started.wait()
        abort.set()

    cutter = asyncio.ensure_future(cut())
    with pytest.raises(asyncio.CancelledError):
        await agent.invoke(abort=abort, session_id="ses_cut", messages=[user_message("go")])
    await cutter
    kept = (await agent.transcript("ses_cut")).messages[-1].info
    assert kept.time.completed is None and kept.usage.input_tokens == 1000 and kept.cost is not None
    chat = attrs(traced.one("chat"))
    assert (chat["gen_ai.usage.input_tokens"], chat["gen_ai.usage.output_tokens"]) == (1000, 100)
    assert chat["gen_ai.usage.cost"] == pytest.approx(kept.cost)


async def test_an_abort_mid_stream_ends_the_chat_span_with_error_type(traced) -> None:
    abort = asyncio.Event()
    agent = We0Agent(ScriptedModel([[text(["a"] * 50)]], delay=0.01), tracer_provider=traced.provider)
    with pytest.raises(asyncio.CancelledError):
        async for ev in agent.stream(abort=abort, messages=[user_message("go")]):
            if ev["type"] == "text-delta":
                abort.set()
    chat = traced.one("chat")
    assert chat.status.status_code == StatusCode.ERROR and attrs(chat)["error.type"] == "CancelledError"


# --------------------------------------------------------------------------- resume: what was executed


async def test_a_resume_is_its_own_run_span_and_only_the_recall_is_an_execution(traced) -> None:
    log = Log()
    p = MemoryPersistence()
    await seed(p, "s", [("read", state("running")), ("write", state("running")), ("stat", state("completed"))])
    agent = We0Agent(ScriptedModel([[text("carried on")]]), tools=make_tools(log), persistence=p,
                     tracer_provider=traced.provider)
    await agent.invoke(mode="resume", session_id="s")
    run = traced.one("invoke_agent")
    assert attrs(run)["we0nb.run.mode"] == "resume" and attrs(run)["gen_ai.conversation.id"] == "s"
    actions = [(dict(e.attributes or {})["we0nb.recovery.action"], dict(e.attributes or {}).get("gen_ai.tool.name"))
               for e in run.events if e.name == "we0nb.recovery"]
    assert actions == [("recall", "read"), ("interrupt", "write"), ("keep", "stat"), ("close", None)]
    (t,) = traced.named("execute_tool")  # the recall ran read again; write and stat did not run
    assert attrs(t)["gen_ai.tool.name"] == "read" and attrs(t)["we0nb.tool.recalled"] is True
    assert log.calls == [("read", "f")]
    assert len(traced.named("chat")) == 1


async def test_a_reconciled_call_is_not_an_execution_and_one_found_not_done_is(traced) -> None:
    ran: list[str] = []

    def answer(ctx: Any, input: dict) -> Reconciled:
        return Reconciled.done("it had run") if input["path"] == "done" else Reconciled.not_done()

    @tool(reconcile=answer)
    def pay(path: str) -> str:
        ran.append(path)
        return "paid"

    p = MemoryPersistence()
    await seed(p, "s", [("pay", state("running", path="done")), ("pay", state("running", path="again"))])
    agent = We0Agent(ScriptedModel([[text("ok")]]), tools=[pay], persistence=p, tracer_provider=traced.provider)
    await agent.invoke(mode="resume", session_id="s")
    run = traced.one("invoke_agent")
    actions = [dict(e.attributes or {})["we0nb.recovery.action"] for e in run.events if e.name == "we0nb.recovery"]
    assert actions[:4] == ["reconcile", "complete", "reconcile", "recall"]
    (t,) = traced.named("execute_tool")
    assert ran == ["again"] and json.dumps(attrs(t)).count("pay") == 1


async def test_an_approval_wait_is_visible_and_a_denied_call_gets_no_tool_span(traced) -> None:
    ran: list[str] = []

    @tool(requires_approval=True)
    def act(q: str) -> str:
        ran.append(q)
        return "done"

    model = ScriptedModel([[tool_call("act", {"q": "x"}), tool_call("act", {"q": "y"})], [text("after")]])
    agent = We0Agent(model, tools=[act], tracer_provider=traced.provider)
    first = await agent.invoke(session_id="s", messages=[user_message("go")])
    assert first.result == "approval"
    run = traced.one("invoke_agent")
    assert attrs(run)["we0nb.run.result"] == "approval" and attrs(run)["we0nb.approvals.pending"] == 2
    asked = [dict(e.attributes or {}) for e in run.events if e.name == "we0nb.approval.request"]
    assert [a["gen_ai.tool.call.id"] for a in asked] == [c.call_id for c in first.approvals]
    assert traced.named("execute_tool") == []
    traced.clear()

    x, y = first.approvals
    await agent.approve("s", x.call_id)
    await agent.deny("s", y.call_id, reason="no")
    await agent.invoke(mode="resume", session_id="s")
    resumed = traced.one("invoke_agent")
    assert attrs(resumed)["we0nb.run.mode"] == "resume" and attrs(resumed)["gen_ai.conversation.id"] == "s"
    actions = [dict(e.attributes or {})["we0nb.recovery.action"] for e in resumed.events if e.name == "we0nb.recovery"]
    assert actions[:2] == ["execute", "deny"]
    (t,) = traced.named("execute_tool")  # the approved one ran; the denied one never did
    assert attrs(t)["gen_ai.tool.call.id"] == x.call_id and ran == ["x"]


async def test_a_compactions_summary_call_is_a_chat_span_too(traced) -> None:
    model = ScriptedModel([[tool_call("look", {"q": "a"}), usage(900, 10)],
                           [text("Summary: look(a) is DONE."), usage(950, 20)]],
                          context_window=1000, price=(1.0, 1.0))
    agent = We0Agent(model, tools=[look], tracer_provider=traced.provider)
    result = await agent.invoke(messages=[user_message("go")])
    assert result.result == "compact"
    chats = sorted(traced.named("chat"), key=lambda s: s.start_time or 0)
    assert [attrs(c).get("we0nb.compaction", False) for c in chats] == [False, True]
    summary = attrs(chats[1])
    assert summary["gen_ai.usage.input_tokens"] == 950 and summary["gen_ai.usage.cost"] == pytest.approx(970 / 1e6)
    assert attrs(traced.one("invoke_agent"))["we0nb.run.result"] == "compact"
    assert result.cost == pytest.approx((910 + 970) / 1e6)


# --------------------------------------------------------------------------- batches


async def test_a_batch_is_one_span_with_its_items_runs_as_children(traced) -> None:
    model = ScriptedModel([[tool_call("look", {"q": "a"}), usage(10, 2)], [text("x"), usage(20, 1)]] * 3, price=(1.0, 1.0))
    agent = We0Agent(model, tools=[look], tracer_provider=traced.provider)
    batch = await agent.batch(["a", "b", "c"], name="nightly", concurrency=2, progress=False)
    (b,) = [s for s in traced.spans if (s.attributes or {}).get("gen_ai.operation.name") == "invoke_workflow"]
    assert b.name == "invoke_workflow nightly" and b.parent is None
    a = attrs(b)
    assert a["we0nb.batch.name"] == "nightly" and a["we0nb.batch.items"] == 3 and a["we0nb.batch.stop"] == 3
    assert batch.cost == pytest.approx(3 * 33 / 1e6) and a["gen_ai.usage.cost"] == pytest.approx(batch.cost)
    runs = traced.named("invoke_agent")
    assert len(runs) == 3 and all(parent_of(r) == b.context.span_id for r in runs)
    assert sorted(attrs(r)["gen_ai.conversation.id"] for r in runs) == sorted(batch.df["session_id"])
    assert {s.context.trace_id for s in traced.spans} == {b.context.trace_id}
    assert trace.get_current_span() is trace.INVALID_SPAN  # the batch's context does not outlive it


# --------------------------------------------------------------------------- telemetry never fails a run


_REAL = TracerProvider().get_tracer("x")  # (made here: the SDK detects its resource with a lock)


class RaisingTracer:
    def __init__(self, after: int) -> None:
        self.left = after
        self.real = _REAL

    def start_span(self, *a: Any, **k: Any) -> Any:
        if self.left <= 0:
            raise RuntimeError("tracer broke")
        self.left -= 1
        return self.real.start_span(*a, **k)


class RaisingProvider:
    def __init__(self, after: int) -> None:
        self.after = after

    def get_tracer(self, *a: Any, **k: Any) -> Any:
        return RaisingTracer(self.after)


@pytest.mark.parametrize("after", [0, 1, 2])
async def test_a_provider_that_raises_in_start_span_never_fails_the_run(after: int,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    agent = We0Agent(ScriptedModel([[tool_call("look", {"q": "a"})], [text("done")]]), tools=[look],
                     tracer_provider=RaisingProvider(after))
    with caplog.at_level(logging.WARNING):
        result = await agent.invoke(messages=[user_message("go")])
    assert result.text == "done"
    assert any("tracer broke" in r.getMessage() for r in caplog.records)


class StuckExporter(SpanExporter):
    """An exporter that blocks (until released) or fails on every export."""

    def __init__(self, fails: bool) -> None:
        self.fails = fails
        self.release = threading.Event()
        self.calls = 0

    def export(self, spans: Any) -> SpanExportResult:
        self.calls += 1
        if self.fails:
            raise ConnectionError("collector unreachable")
        self.release.wait(60)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.release.set()


@pytest.mark.parametrize("fails", [False, True], ids=["blocks", "fails"])
async def test_an_exporter_that_blocks_or_fails_never_holds_the_run(fails: bool) -> None:
    exporter = StuckExporter(fails)
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=1, max_export_batch_size=2))
    agent = We0Agent(ScriptedModel([[tool_call("look", {"q": str(i)})] for i in range(20)] + [[text("done")]]),
                     tools=[look], tracer_provider=provider)
    try:
        result = await asyncio.wait_for(agent.invoke(messages=[user_message("go")]), 20)
        assert result.text == "done" and result.steps == 21
        for _ in range(200):  # the exporter was called (and is stuck in, or failed) while the run went on
            if exporter.calls:
                break
            await asyncio.sleep(0.01)
        assert exporter.calls >= 1
    finally:
        exporter.release.set()
        await asyncio.to_thread(provider.shutdown)


class Counting:
    """A provider that counts the spans its tracer is asked for (and makes them, sampled by ``sampler``)."""

    def __init__(self, sampler: Any) -> None:
        self.exporter = InMemorySpanExporter()
        self.real = TracerProvider(sampler=sampler)
        self.real.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.started = 0

    def get_tracer(self, *a: Any, **k: Any) -> Any:
        real, outer = self.real.get_tracer(*a, **k), self

        class Tracer:
            def start_span(self, *a: Any, **k: Any) -> Any:
                outer.started += 1
                return real.start_span(*a, **k)
        return Tracer()


async def test_a_run_sampled_out_asks_for_no_child_span_and_a_sampled_one_is_traced_without_a_guard() -> None:
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON

    from we0nb.telemetry.run import RunTracer

    for sampler, started, finished in ((ALWAYS_OFF, 1, 0), (ALWAYS_ON, 4, 4)):
        provider = Counting(sampler)
        agent = We0Agent(ScriptedModel([[tool_call("look", {"q": "a"})], [text("done")]]), tools=[look],
                         tracer_provider=provider)
        result = await agent.invoke(messages=[user_message("go")])
        assert result.text == "done"
        # sampled out: the run's span only (not recorded, so neither would its children be);
        # sampled: the run, its two model calls and its tool
        assert (provider.started, len(provider.exporter.get_finished_spans())) == (started, finished)
    # the tracer guards itself (it never fails a run: the tests above): the engine calls it as it is
    assert isinstance(observe.observer_for(agent, agent.build_request(messages=[user_message("x")])), RunTracer)


# --------------------------------------------------------------------------- off


async def test_without_a_provider_no_observer_is_made() -> None:
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)  # (no global one in this process)
    agent = We0Agent(ScriptedModel([[text("hi")]]))
    assert observe.observer_for(agent, agent.build_request(messages=[user_message("x")])) is None


def test_import_we0nb_imports_no_opentelemetry_and_a_global_provider_is_used() -> None:
    code = """
import sys, asyncio
import we0nb
print(sorted(m for m in sys.modules if m.startswith(("opentelemetry", "we0nb.telemetry", "genai_prices"))))
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from we0nb import ScriptedModel, We0Agent, user_message
from we0nb.testing import text
agent = We0Agent(ScriptedModel([[text("hi")], [text("again")]]))
asyncio.run(agent.invoke(messages=[user_message("x")]))  # OpenTelemetry imported, no provider: no span
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
asyncio.run(agent.invoke(messages=[user_message("x")]))
print(sorted(s.name for s in exporter.get_finished_spans()))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["[]", "['chat scripted', 'invoke_agent we0nb']"]


def test_tracing_keywords_are_checked() -> None:
    with pytest.raises(TypeError, match=r"We0Agent\(tracer_provider=\.\.\.\): expected an OpenTelemetry TracerProvider"):
        We0Agent(ScriptedModel([]), tracer_provider="console")
    with pytest.raises(TypeError, match=r"We0Agent\(capture_content=\.\.\.\): expected True or False"):
        We0Agent(ScriptedModel([]), capture_content="yes")
