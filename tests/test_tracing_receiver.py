"""Spans as a real observability tool sees them (issue 35): exported over OTLP/HTTP with the
official exporter to Arize Phoenix started on 127.0.0.1, read back through Phoenix's own REST
API — the agent, chat and tool spans are there, recognised as GenAI spans (Phoenix maps them
to its AGENT / LLM / TOOL kinds and its own token and session attributes).

Phoenix is installed once in a venv of its own (:mod:`receivers`); the tests skip, saying
why, where it cannot be. Also here: an HTTP model's chat span (the OpenAI adapter's first
stream imports on the loop, so this module is not under the blocking-call guard).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

pytest.importorskip("opentelemetry.sdk", reason="needs opentelemetry-sdk (pip install opentelemetry-sdk)")

from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

from we0nb import MemoryPersistence, ScriptedModel, We0Agent, tool, user_message  # noqa: E402
from we0nb.testing import text, tool_call, usage  # noqa: E402

from receivers import PHOENIX, Phoenix, phoenix_python  # noqa: E402


@tool(side_effects=False)
def look(q: str) -> str:
    return f"seen {q}"


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Phoenix]:
    python, why = phoenix_python()
    if python is None:
        pytest.skip(why)
    with Phoenix(python, tmp_path_factory.mktemp("phoenix")) as px:
        yield px


def exporting_to(phoenix: Phoenix, project: str) -> TracerProvider:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    provider = TracerProvider(resource=Resource.create({"service.name": "we0nb-tests",
                                                        "openinference.project.name": project}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=phoenix.otlp)))
    return provider


def read_back(phoenix: Phoenix, project: str, n: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 60
    while True:
        spans = phoenix.spans(project)
        if len(spans) >= n or time.monotonic() > deadline:
            return spans
        time.sleep(0.5)


@pytest.mark.receiver
def test_runs_reach_phoenix_over_otlp_and_are_read_back_as_genai_spans(phoenix: Phoenix) -> None:
    project = f"we0nb-{uuid.uuid4().hex[:8]}"
    provider = exporting_to(phoenix, project)

    @tool(requires_approval=True)
    def act(q: str) -> str:
        return "acted"

    model = ScriptedModel([[tool_call("look", {"q": "a"}), tool_call("act", {"q": "b"}), usage(1200, 80)],
                           [text("done"), usage(1500, 20)]], provider="openai", model_id="gpt-4o")
    agent = We0Agent(model, tools=[look, act], persistence=MemoryPersistence(), tracer_provider=provider)

    async def runs() -> None:
        first = await agent.invoke(session_id="s-phoenix", messages=[user_message("go")])
        assert first.result == "approval"
        await agent.approve("s-phoenix", first.approvals[0].call_id)
        await agent.invoke(mode="resume", session_id="s-phoenix")

    asyncio.run(runs())
    assert provider.force_flush(30_000)
    spans = read_back(phoenix, project, 6)
    provider.shutdown()

    by_kind: dict[str, list[dict[str, Any]]] = {}
    for s in spans:
        by_kind.setdefault(s["attributes"].get("gen_ai.operation.name"), []).append(s)
    runs_, chats, tools = by_kind["invoke_agent"], by_kind["chat"], by_kind["execute_tool"]
    assert len(runs_) == 2 and len(chats) == 2 and len(tools) == 2, [s["name"] for s in spans]
    # Phoenix recognised them: its own span kinds, and its own attributes derived from ours
    assert {s["span_kind"] for s in runs_} == {"AGENT"}
    assert {s["span_kind"] for s in chats} == {"LLM"} and {s["span_kind"] for s in tools} == {"TOOL"}
    assert {s["attributes"]["session.id"] for s in runs_} == {"s-phoenix"}  # the conversation id, as a session
    assert sorted(s["attributes"]["we0nb.run.mode"] for s in runs_) == ["prompt", "resume"]
    first_chat = next(c for c in chats if c["attributes"]["gen_ai.usage.input_tokens"] == 1200)
    assert first_chat["attributes"]["llm.token_count.prompt"] == 1200
    assert first_chat["attributes"]["llm.model_name"] == "gpt-4o" and first_chat["attributes"]["gen_ai.usage.cost"] > 0
    assert sorted(t["attributes"]["tool.name"] for t in tools) == ["act", "look"]
    # the tree: each chat and tool span is a child of its run's span, in the run's trace
    run_ids = {r["context"]["span_id"]: r["context"]["trace_id"] for r in runs_}
    for s in chats + tools:
        assert run_ids[s["parent_id"]] == s["context"]["trace_id"]
    resume = next(r for r in runs_ if r["attributes"]["we0nb.run.mode"] == "resume")
    act_span = next(t for t in tools if t["attributes"]["tool.name"] == "act")
    assert act_span["parent_id"] == resume["context"]["span_id"]  # approved, then executed by the resume
    assert [e["name"] for e in resume["events"]].count("we0nb.recovery") >= 1


@pytest.mark.receiver
def test_a_batch_reaches_phoenix_as_one_parent_of_its_runs(phoenix: Phoenix) -> None:
    project = f"we0nb-{uuid.uuid4().hex[:8]}"
    provider = exporting_to(phoenix, project)
    agent = We0Agent(ScriptedModel([[text("x"), usage(10, 1)]] * 3), tracer_provider=provider)
    asyncio.run(agent.batch(["a", "b", "c"], name="nightly", progress=False))
    assert provider.force_flush(30_000)
    spans = read_back(phoenix, project, 7)
    provider.shutdown()
    (batch,) = [s for s in spans if s["name"] == "invoke_workflow nightly"]
    runs = [s for s in spans if s["attributes"].get("gen_ai.operation.name") == "invoke_agent"]
    assert len(runs) == 3 and {r["parent_id"] for r in runs} == {batch["context"]["span_id"]}


# --------------------------------------------------------------------------- an HTTP model (in memory)


def test_an_http_model_gives_its_server_address_and_port_and_is_priced_as_openai() -> None:
    pytest.importorskip("openai")
    from openai_fake import FakeServer, sse, words
    from we0nb.models.openai import OpenAIChatModel

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with FakeServer() as server:
        server.play(sse(words("hel", "lo", usage={"prompt_tokens": 1000, "completion_tokens": 10,
                                                  "total_tokens": 1010})))
        model = OpenAIChatModel("gpt-4o-mini", base_url=server.url, api_key="sk-test")
        result = asyncio.run(We0Agent(model, tracer_provider=provider).invoke(messages=[user_message("hi")]))
    (chat,) = [s for s in exporter.get_finished_spans() if s.name.startswith("chat ")]
    attrs = dict(chat.attributes or {})
    assert attrs["server.address"] == "127.0.0.1" and attrs["server.port"] == server.httpd.server_address[1]
    assert attrs["gen_ai.provider.name"] == "openai" and attrs["gen_ai.request.model"] == "gpt-4o-mini"
    assert result.cost is not None and result.cost > 0 and attrs["gen_ai.usage.cost"] == pytest.approx(result.cost)


def test_an_mcp_call_carries_the_mcp_client_attributes(tmp_path: Path) -> None:
    pytest.importorskip("mcp")
    from mcpkit import stdio_server

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))

    async def go() -> None:
        server = stdio_server(tmp_path / "ledger")
        model = ScriptedModel([[tool_call("echo", {"text": "hi"})], [text("done")]])
        async with We0Agent(model, tools=[server], tracer_provider=provider) as agent:
            await agent.invoke(messages=[user_message("go")])

    asyncio.run(go())
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "execute_tool echo"]
    attrs = dict(span.attributes or {})
    assert attrs["gen_ai.tool.type"] == "extension" and attrs["mcp.method.name"] == "tools/call"
    assert attrs["network.transport"] == "pipe" and attrs["gen_ai.tool.name"] == "echo"


def test_the_phoenix_pin_is_the_one_the_docs_name() -> None:
    docs = (Path(__file__).resolve().parent.parent / "docs" / "tracing.md").read_text()
    assert PHOENIX.split("==")[1] in docs
