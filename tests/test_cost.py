"""What a run cost (issue 35, SPEC §13): priced when each model call ends, persisted with its
message, summed by run, session and batch — None/NaN when unknown, never 0 for unknown."""

from __future__ import annotations

import asyncio
import logging
import math
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import genai_prices.data  # noqa: F401  (its prices, imported here: not on the event loop under the blocking-call guard)
import pandas  # noqa: F401
import pytest
from genai_prices import Usage as PriceUsage, calc_price

from we0nb import FunctionModel, MemoryPersistence, Model, ScriptedModel, We0Agent, messages_df, sessions_df, tool, user_message
from we0nb.messages import Usage
from we0nb.models.base import FinishEvent, TextDelta, ToolCallEvent
from we0nb.models.pricing import call_cost
from we0nb.testing import text, tool_call, usage

from sql_support import backend_for

BACKENDS = ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    for b in backend_for(request.param, tmp_path):
        yield b.fresh()


def expected(model: str, provider: str, **tokens: int) -> float:
    """The price genai-prices gives these token counts (input_tokens counts cached reads and writes)."""
    return float(calc_price(PriceUsage(**tokens), model, provider_id=provider).total_price)


@tool(side_effects=False)
def look(q: str) -> str:
    return "seen"


# --------------------------------------------------------------------------- one call's price


async def test_a_call_is_priced_from_its_usage_with_cached_tokens_at_the_providers_cache_price() -> None:
    model = ScriptedModel([[tool_call("look", {"q": "a"}), usage(1000, 500, cached_tokens=800)],
                           [text("done"), usage(1600, 40)]], provider="openai", model_id="gpt-4o")
    agent = We0Agent(model, tools=[look])
    result = await agent.invoke(messages=[user_message("go")])
    steps = [m.info for m in (await agent.transcript(result.session_id)).messages if m.info.role == "assistant"]
    first = expected("gpt-4o", "openai", input_tokens=1000, cache_read_tokens=800, output_tokens=500)
    second = expected("gpt-4o", "openai", input_tokens=1600, output_tokens=40)
    assert steps[0].cost == pytest.approx(first) and steps[1].cost == pytest.approx(second)
    assert first < expected("gpt-4o", "openai", input_tokens=1000, output_tokens=500)  # cached reads are cheaper
    assert result.cost == pytest.approx(first + second)


async def test_cache_writes_are_priced_as_the_provider_prices_them() -> None:
    model = ScriptedModel([[text("hi"), usage(3000, 100, cache_write_tokens=2000)]], provider="anthropic",
                          model_id="claude-sonnet-4-5")
    result = await We0Agent(model).invoke(messages=[user_message("go")])
    written = expected("claude-sonnet-4-5", "anthropic", input_tokens=3000, cache_write_tokens=2000, output_tokens=100)
    assert result.cost == pytest.approx(written)
    assert written > expected("claude-sonnet-4-5", "anthropic", input_tokens=3000, output_tokens=100)


async def test_a_model_given_its_price_is_priced_with_it() -> None:
    model = ScriptedModel([[text("hi"), usage(2_000_000, 500_000, cached_tokens=1_000_000)]], price=(0.5, 2.0))
    result = await We0Agent(model).invoke(messages=[user_message("go")])
    assert result.cost == pytest.approx(2.0 * 0.5 + 0.5 * 2.0)  # every input token (cached too) at the input price


async def test_an_offline_model_has_no_price_and_that_is_none_not_zero(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="we0nb.cost"):
        result = await We0Agent(ScriptedModel([[text("hi"), usage(10, 5)]])).invoke(messages=[user_message("go")])
    assert result.cost is None
    assert not caplog.records  # nothing to look up: nothing to warn about


async def test_an_unknown_model_costs_none_and_says_why_once_per_model(caplog: pytest.LogCaptureFixture) -> None:
    model = ScriptedModel([[text("a"), usage(10, 5)], [text("b"), usage(10, 5)]], provider="openai",
                          model_id="my-finetune-that-nobody-prices")
    agent = We0Agent(model)
    with caplog.at_level(logging.WARNING, logger="we0nb.cost"):
        first = await agent.invoke(messages=[user_message("go")])
        second = await agent.invoke(messages=[user_message("again")])
    assert first.cost is None and second.cost is None
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "my-finetune-that-nobody-prices" in said[0] and "price=" in said[0]


def test_openai_chat_model_is_priced_by_its_model_id_as_openai_whatever_its_base_url() -> None:
    from we0nb.models.openai import OpenAIChatModel

    u = Usage(input_tokens=1200, output_tokens=300, cached_tokens=200)
    local = OpenAIChatModel("gpt-4o-mini", base_url="http://127.0.0.1:9/v1", api_key="x")
    assert local.server_address == "127.0.0.1"
    assert call_cost(local, u) == pytest.approx(expected("gpt-4o-mini", "openai", input_tokens=1200,
                                                         cache_read_tokens=200, output_tokens=300))
    own = OpenAIChatModel("gpt-4o-mini", base_url="http://127.0.0.1:9/v1", api_key="x", price=(0.0, 0.0))
    assert call_cost(own, u) == 0.0  # a price of its own: known, and 0
    other = OpenAIChatModel("llama-3.1-8b-instant", base_url="http://127.0.0.1:9/v1", api_key="x", provider="groq")
    assert call_cost(other, u) == pytest.approx(expected("llama-3.1-8b-instant", "groq", input_tokens=1200,
                                                         cache_read_tokens=200, output_tokens=300))


def test_a_call_that_reported_no_usage_has_no_known_cost() -> None:
    assert call_cost(ScriptedModel([], price=(1, 1)), None) is None


class RawModel(Model):
    """Streams the given model events as they are: step ``i`` of a turn plays ``steps[i]``."""

    def __init__(self, steps: list[list[Any]], price: Any) -> None:
        self._set_pricing(None, price)
        self.steps = steps

    async def stream(self, request: Any) -> AsyncIterator[Any]:
        for ev in self.steps[request.turn_steps]:
            yield ev


async def test_a_priced_call_whose_provider_counted_no_token_costs_none_not_zero() -> None:
    """A finish without usage leaves every count at 0: the price is known, the usage is not,
    so the cost is unknown (SPEC §13: never 0 for unknown), and so is the run's."""
    model = RawModel([[ToolCallEvent("c1", "look", {"q": "a"}), FinishEvent("tool-calls")],
                      [TextDelta("done"), FinishEvent("stop", Usage(input_tokens=100, output_tokens=10))]],
                     price=(1.0, 1.0))
    agent = We0Agent(model, tools=[look])
    result = await agent.invoke(messages=[user_message("go")])
    steps = [m.info for m in (await agent.transcript(result.session_id)).messages if m.info.role == "assistant"]
    assert call_cost(model, Usage()) is None and call_cost(model, Usage(output_tokens=1)) == pytest.approx(1e-6)
    assert steps[0].cost is None and steps[1].cost == pytest.approx(110 / 1e6)
    assert result.cost is None


async def test_a_step_without_a_finish_event_makes_the_runs_cost_unknown() -> None:
    model = RawModel([[ToolCallEvent("c1", "look", {"q": "a"}),
                       FinishEvent("tool-calls", Usage(input_tokens=100, output_tokens=10))],
                      [TextDelta("done")]], price=(1.0, 1.0))  # (step 2 never reports its usage)
    agent = We0Agent(model, tools=[look])
    result = await agent.invoke(messages=[user_message("go")])
    steps = [m.info for m in (await agent.transcript(result.session_id)).messages if m.info.role == "assistant"]
    assert steps[0].cost == pytest.approx(110 / 1e6) and steps[1].cost is None
    assert result.cost is None  # one unknown step: the run's sum is unknown


@pytest.mark.parametrize("status, cost", [(429, 0.0), (400, 0.0), (500, None), (None, None)])
async def test_a_request_the_provider_refused_before_any_output_cost_nothing_known(status, cost) -> None:
    # a rate-limited call's cost was unknown, so one 429 made a fully priced batch's cost unknown
    from we0nb import ModelError
    from we0nb.errors import ModelProviderError

    def refuse(request: Any) -> Any:
        raise ModelProviderError("no", status_code=status)

    agent = We0Agent(FunctionModel(refuse, provider="openai", model_id="gpt-4o"))
    with pytest.raises(ModelError):
        await agent.invoke(session_id="ses_refused", messages=[user_message("q")])
    info = (await agent.transcript("ses_refused")).messages[-1].info
    assert info.error is not None and info.usage.input_tokens == 0
    assert info.cost == cost  # (a 4xx before any output: refused, nothing billed; else unknown)


async def test_a_call_refused_after_some_output_keeps_an_unknown_cost() -> None:
    from we0nb import ModelError
    from we0nb.errors import ModelProviderError

    from we0nb.testing import fail

    model = ScriptedModel([[text("some words"), fail(ModelProviderError("cut", status_code=429))]],
                          provider="openai", model_id="gpt-4o")
    agent = We0Agent(model)
    with pytest.raises(ModelError):
        await agent.invoke(session_id="ses_partly", messages=[user_message("q")])
    assert (await agent.transcript("ses_partly")).messages[-1].info.cost is None


async def test_a_run_without_a_model_call_cost_nothing() -> None:
    @tool(requires_approval=True)
    def act(q: str) -> str:
        return "done"

    agent = We0Agent(ScriptedModel([[tool_call("act", {"q": "a"}), usage(10, 5)], [text("ok"), usage(10, 5)]],
                                   price=(1.0, 1.0)), tools=[act])
    first = await agent.invoke(messages=[user_message("go")])
    assert first.result == "approval" and first.cost == pytest.approx(15 / 1e6)
    (call,) = first.approvals
    await agent.deny(first.session_id, call.call_id, reason="no")
    resumed = await agent.invoke(mode="resume", session_id=first.session_id)
    assert resumed.steps == 1 and resumed.cost == pytest.approx(15 / 1e6)  # only its own step


# --------------------------------------------------------------------------- persisted, and summed


async def test_the_cost_is_persisted_with_the_message_and_a_new_price_never_rewrites_it(store) -> None:
    first = We0Agent(ScriptedModel([[text("a"), usage(1000, 1000)]], price=(1.0, 1.0)), persistence=store)
    r1 = await first.invoke(session_id="s", messages=[user_message("go")])
    second = We0Agent(ScriptedModel([[text("b"), usage(1000, 1000)]], price=(5.0, 5.0)), persistence=store)
    r2 = await second.invoke(session_id="s", messages=[user_message("again")])
    assert (r1.cost, r2.cost) == (pytest.approx(0.002), pytest.approx(0.01))
    costs = [m.info.cost for m in (await store.load_transcript("s")).messages if m.info.role == "assistant"]
    assert costs == [pytest.approx(0.002), pytest.approx(0.01)]


@tool(side_effects=True)
async def pay(q: str) -> str:
    await asyncio.sleep(30)  # (aborted while it runs)
    return "paid"


async def test_a_model_call_aborted_while_its_tools_run_keeps_what_it_cost(store) -> None:
    """The call's usage and cost are written with its first call's write-ahead, so an abort
    while the calls run does not lose them; resume then closes the message with them."""
    model = ScriptedModel([[tool_call("pay", {"q": "a"}), usage(1000, 1000)], [text("ok"), usage(1000, 0)]],
                          price=(1.0, 1.0))
    agent = We0Agent(model, tools=[pay], persistence=store)
    abort = asyncio.Event()
    with pytest.raises(asyncio.CancelledError):
        async for ev in agent.stream(abort=abort, session_id="s", messages=[user_message("go")]):
            if ev["type"] == "tool" and ev["part"].state.status == "running":
                abort.set()
    first = [m.info for m in (await store.load_transcript("s")).messages if m.info.role == "assistant"][0]
    assert first.time.completed is None  # (unfinished: the abort came mid-step)
    assert (first.usage.input_tokens, first.usage.output_tokens, first.cost) == (1000, 1000, pytest.approx(0.002))
    resumed = await agent.invoke(session_id="s", mode="resume")
    steps = [m.info for m in (await store.load_transcript("s")).messages if m.info.role == "assistant"]
    assert steps[0].cost == pytest.approx(0.002) and steps[0].time.completed is not None
    assert resumed.cost == pytest.approx(0.001)  # (the resumed run's own model call)


async def test_frames_have_a_cost_column_nan_when_unknown(store) -> None:
    priced = We0Agent(ScriptedModel([[tool_call("look", {"q": "a"}), usage(1000, 100)], [text("x"), usage(1000, 100)]],
                                    price=(1.0, 2.0)), tools=[look], persistence=store)
    await priced.invoke(session_id="a-priced", messages=[user_message("go")])
    await We0Agent(ScriptedModel([[text("y"), usage(5, 5)]]), persistence=store).invoke(
        session_id="b-unpriced", messages=[user_message("go")])
    mixed = We0Agent(ScriptedModel([[text("z"), usage(1000, 0)]], price=(1.0, 1.0)), persistence=store)
    await mixed.invoke(session_id="c-mixed", messages=[user_message("go")])
    await We0Agent(ScriptedModel([[text("w"), usage(1, 1)]]), persistence=store).invoke(
        session_id="c-mixed", messages=[user_message("more")])
    await store.flush()

    msgs = await asyncio.to_thread(messages_df, store)
    assert str(msgs["cost"].dtype) == "float64"
    assert msgs[msgs["role"] == "user"]["cost"].isna().all()
    asst = msgs[msgs["role"] == "assistant"].set_index("session_id")["cost"]
    assert list(asst.loc["a-priced"]) == [pytest.approx(0.0012), pytest.approx(0.0012)]
    assert math.isnan(asst.loc["b-unpriced"])
    sessions = (await asyncio.to_thread(sessions_df, store)).set_index("session_id")["cost"]
    assert str(sessions.dtype) == "float64"
    assert sessions.loc["a-priced"] == pytest.approx(0.0024)
    assert math.isnan(sessions.loc["b-unpriced"]) and math.isnan(sessions.loc["c-mixed"])  # one step unknown: NaN
    only = await asyncio.to_thread(sessions_df, store, "a-priced")
    assert list(only["cost"]) == [pytest.approx(0.0024)]


async def test_a_message_document_holding_nul_still_gives_its_cost(store) -> None:
    """PostgreSQL refuses to extract anything from a JSON document holding ``\\u0000`` (here the
    model id): the frames read such a message's cost off its document."""
    model = ScriptedModel([[text("hi"), usage(1000, 0)]], price=(1.0, 1.0), model_id="odd\x00model")
    await We0Agent(model, persistence=store).invoke(session_id="s", messages=[user_message("go")])
    await store.flush()
    assert (await asyncio.to_thread(messages_df, store))["cost"].dropna().tolist() == [pytest.approx(0.001)]
    assert (await asyncio.to_thread(sessions_df, store))["cost"].tolist() == [pytest.approx(0.001)]


def test_max_cost_must_be_a_positive_number() -> None:
    agent = We0Agent(ScriptedModel([]), persistence=MemoryPersistence())
    for bad in (0, -1, 0.0, "5", True, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=r"batch\(max_cost=\.\.\.\): expected a budget in USD, a number > 0"):
            asyncio.run(agent.batch(["a"], max_cost=bad, progress=False))


# --------------------------------------------------------------------------- batches


def priced_agent(store: Any, calls: list[str], *, price: Any = (1.0, 1.0), delay: float = 0.0) -> We0Agent:
    """Each item: one ``look`` step, then an answer; every call reports 1,000 input tokens
    ($0.001 at $1 per million: $0.002 per item)."""
    async def reply(request: Any) -> list:
        prompt = next(m.text for m in request.messages if getattr(m, "role", None) == "user")
        calls.append(prompt)
        if delay:
            await asyncio.sleep(delay)
        if request.turn_steps == 0:
            return [tool_call("look", {"q": prompt}), usage(1000, 0)]
        return [text(f"answer to {prompt}"), usage(1000, 0)]

    return We0Agent(FunctionModel(reply, price=price), tools=[look], persistence=store)


async def test_a_batch_frame_has_each_items_cost_and_the_result_the_total(store) -> None:
    from we0nb import batch_df

    batch = await priced_agent(store, []).batch(["a", "b", "c"], name="priced", progress=False)
    assert batch.cost == pytest.approx(0.006)
    df = batch.df
    assert str(df["cost"].dtype) == "float64" and df["cost"].tolist() == [pytest.approx(0.002)] * 3
    again = await asyncio.to_thread(batch_df, store, "priced")
    assert again["cost"].tolist() == df["cost"].tolist()
    unpriced = await priced_agent(store, [], price=None).batch(["d"], name="unpriced", progress=False)
    assert unpriced.cost is None and math.isnan(unpriced.df["cost"][0])


async def test_max_cost_claims_no_new_item_once_the_batch_cost_reaches_it(store) -> None:
    calls: list[str] = []
    names = [f"p{i}" for i in range(6)]
    first = await priced_agent(store, calls).batch(names, name="budget", concurrency=1, max_cost=0.005,
                                                   progress=False)
    assert first.stopped == "max_cost"
    assert first.counts == {"pending": 3, "stop": 3}  # $0.004 after two items: a third starts; $0.006: no fourth
    assert first.cost == pytest.approx(0.006) and sorted(set(calls)) == ["p0", "p1", "p2"]
    # a continuation reads what was spent from the store: the budget is already reached
    again = await priced_agent(store, calls).batch(names, name="budget", concurrency=1, max_cost=0.005,
                                                   progress=False)
    assert again.stopped == "max_cost" and again.counts == {"pending": 3, "stop": 3} and len(calls) == 6
    more = await priced_agent(store, calls).batch(names, name="budget", concurrency=1, max_cost=0.0085,
                                                  progress=False)
    assert more.stopped == "max_cost" and more.counts == {"pending": 1, "stop": 5}
    rest = await priced_agent(store, calls).batch(names, name="budget", concurrency=1, progress=False)
    assert rest.stopped is None and rest.counts == {"stop": 6} and rest.cost == pytest.approx(0.012)


async def test_an_items_last_call_counts_before_the_slot_takes_the_next_item(store) -> None:
    """One priced call per item: on a store whose commits wait, an item hands its slot on at its
    last call, before that call's message (its cost) is written; the budget counts it all the
    same, so the stores agree — no item starts once the cost so far reaches the budget."""
    def one_dollar(request: Any) -> list:
        return [text("a"), usage(1_000_000, 0)]

    for concurrency, budget, started in [(1, 3.0, 3), (1, 1.0, 1), (4, 1.0, 4)]:
        agent = We0Agent(FunctionModel(one_dollar, price=(1.0, 1.0)), persistence=store)
        batch = await agent.batch([f"p{i}" for i in range(12)], name=f"dollars-{concurrency}-{budget}",
                                  concurrency=concurrency, max_cost=budget, progress=False)
        assert batch.stopped == "max_cost"
        assert batch.counts == {"pending": 12 - started, "stop": started}, (concurrency, budget)
        assert batch.cost == pytest.approx(started)


async def test_a_retried_items_new_calls_count_against_the_budget_at_once(store) -> None:
    """Items whose first call cost $1 and whose second failed are retried under a budget of what
    was spent + $3: each retry's new $1 call counts at once, though the store already holds a cost
    for its item — three items end, then the budget stops the claims (on every store)."""
    from we0nb.models.base import ToolResult

    failing = {"on": True}

    def reply(request: Any) -> list:
        if any(isinstance(m, ToolResult) for m in request.messages):
            if failing["on"]:
                raise RuntimeError("the model failed")
            return [text("done"), usage(1_000_000, 0)]
        return [tool_call("look", {"q": "x"}), usage(1_000_000, 0)]

    agent = We0Agent(FunctionModel(reply, price=(1.0, 1.0)), tools=[look], persistence=store)
    names = [f"p{i}" for i in range(8)]
    first = await agent.batch(names, name="retried", concurrency=1, progress=False)
    assert first.counts == {"failed": 8}  # ($8 priced; each failed call's cost is unknown: counts nothing)
    failing["on"] = False
    again = await agent.batch(names, name="retried", concurrency=1, retry_failed=True, max_cost=11.0,
                              progress=False)
    # (on a store whose commits wait, the items claimed ahead and given back read "aborted")
    assert again.stopped == "max_cost" and again.counts["stop"] == 3 and sum(again.counts.values()) == 8, again.counts


async def test_items_running_when_the_budget_is_reached_end_normally() -> None:
    calls: list[str] = []
    batch = await priced_agent(MemoryPersistence(), calls, delay=0.01).batch(
        [f"p{i}" for i in range(8)], concurrency=3, max_cost=0.001, progress=False)
    assert batch.stopped == "max_cost"
    assert batch.counts == {"pending": 5, "stop": 3}  # the three started at once ran to their end: none aborted


async def test_unpriced_calls_count_nothing_against_the_budget() -> None:
    batch = await priced_agent(MemoryPersistence(), [], price=None).batch(["a", "b"], concurrency=1,
                                                                         max_cost=0.001, progress=False)
    assert batch.stopped is None and batch.counts == {"stop": 2} and batch.cost is None


# --------------------------------------------------------------------------- shown


async def test_the_live_view_and_the_panel_show_the_running_total() -> None:
    pytest.importorskip("ipywidgets")
    from we0nb.notebook import RunPanel
    from we0nb.notebook.live import LiveView

    class Handle:
        def __init__(self) -> None:
            self.bundles: list[dict] = []

        def update(self, bundle: dict) -> None:
            self.bundles.append(bundle)

    handle = Handle()
    agent = We0Agent(ScriptedModel([[text("one"), usage(1000, 0)], [text("two"), usage(3000, 0)]], price=(1.0, 1.0)))
    panel = RunPanel(agent, display=lambda b: handle)
    panel.start("a")
    assert (await panel.wait()).cost == pytest.approx(0.001)
    panel.start("b")
    assert (await panel.wait()).cost == pytest.approx(0.003)
    assert panel.view.cost == pytest.approx(0.004) and panel.view.model_calls == 2  # over the panel's runs
    final = handle.bundles[-1]
    assert "cost $0.004" in final["text/html"] and "cost: $0.004 (2 model calls)" in final["text/plain"]

    unpriced = LiveView(display=lambda b: None)
    await unpriced.consume(We0Agent(ScriptedModel([[text("x")]])).stream(messages=[user_message("go")]))
    assert unpriced.cost is None and "cost" not in unpriced.text(final=True)  # unknown: nothing shown


def test_the_cli_shows_a_sessions_and_a_batchs_cost(tmp_path: Path) -> None:
    import subprocess
    import sys

    url = f"sqlite:///{tmp_path / 'we0.db'}"

    async def make() -> None:
        from we0nb import SqlPersistence

        p = SqlPersistence(url)
        await priced_agent(p, []).batch(["a", "b"], name="nightly", progress=False)
        await We0Agent(ScriptedModel([[text("x"), usage(10, 1)]]), persistence=p).invoke(
            session_id="unpriced", messages=[user_message("go")])
        sid = (await p.batch_items("nightly"))[0].session_id
        await p.close()
        return sid

    sid = asyncio.run(make())

    def cli(*args: str) -> str:
        out = subprocess.run([sys.executable, "-m", "we0nb", *args, "--db", url], capture_output=True, text=True,
                             timeout=120, cwd=Path(__file__).resolve().parent.parent)
        assert out.returncode == 0, out.stderr
        return out.stdout

    shown = cli("show", sid)
    assert "cost=$0.001" in shown and "cost: $0.002 (2 model calls)" in shown
    assert "cost: unknown: 1 model call, none with a known price" in cli("show", "unpriced")
    assert "  cost: $0.004" in cli("batch", "show", "nightly")


def test_processes_sharing_a_batch_share_its_budget(tmp_path: Path) -> None:
    """Two processes on one batch, each with concurrency 1, under a $0.01 budget ($0.002 per
    item): what the other spent is read from the store, so together they start ~5 items (one
    more each at most: an item may be running when the budget is reached) — alone, each
    would have started 5."""
    import json
    import subprocess
    import sys

    url = f"sqlite:///{tmp_path / 'shared.db'}"
    here = Path(__file__).resolve().parent
    procs = [subprocess.Popen([sys.executable, str(here / "cost_worker.py"), "--url", url, "--items", "20",
                               "--max-cost", "0.01"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        results.append(json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:]))
    assert [r["stopped"] for r in results] == ["max_cost", "max_cost"]

    async def read() -> Any:
        from we0nb import SqlPersistence

        p = SqlPersistence(url)
        try:
            return await p.batch_items("shared"), await p.batch_costs("shared")
        finally:
            await p.close()

    items, costs = asyncio.run(read())
    ran = [it for it in items if it.status != "pending"]
    assert all(it.status == "stop" for it in ran)
    assert 5 <= len(ran) <= 7, len(ran)  # 5 reach the budget; each process may have had one more running
    assert sum(c.priced for c in costs) == pytest.approx(0.002 * len(ran))


def test_a_messages_cost_is_the_last_member_of_its_document() -> None:
    """PostgreSQL reads a batch's costs off the end of each message's JSON document
    (``,"cost":<n>}``) without parsing it (statements._PG_COST): the field must stay last."""
    import re

    from we0nb.messages import AssistantMessage, MessageError, MessageTime
    from we0nb.persistence.sql.statements import _PG_COST

    pattern = re.compile(_PG_COST.strip("'"))
    m = AssistantMessage(id="m", session_id="s", time=MessageTime(created=1.0), cost=1.5e-05,
                         error=MessageError(reason="x", message="y", metadata={"cost": 99}))
    doc = m.__pydantic_serializer__.to_json(m).decode()
    found = pattern.search(doc)
    assert found is not None and float(found.group(1)) == 1.5e-05
    unknown = m.model_copy(update={"cost": None})
    assert pattern.search(unknown.__pydantic_serializer__.to_json(unknown).decode()) is None  # not the nested one


async def test_the_budget_reads_the_batchs_cost_less_often_when_a_read_is_slow(monkeypatch: pytest.MonkeyPatch
                                                                                ) -> None:
    """A read of the sum costs like the batch's model calls (~50 ms for 1,000 items on SQLite, on the
    loop's thread): reads are spaced so that they take at most READ_SHARE of the time."""
    from we0nb.batch import runner
    from we0nb.persistence.batches import ItemCost

    clock = [100.0]
    monkeypatch.setattr(runner.time, "monotonic", lambda: clock[0])

    class SlowSum:
        reads = 0
        took = 0.0
        costs = {0: 0.001}  # what each item's calls cost, as stored

        async def batch_costs(self, name: str) -> list[ItemCost]:
            self.reads += 1
            clock[0] += self.took  # (the read's own duration)
            return [ItemCost(i, c) for i, c in self.costs.items()]

    store = SlowSum()
    budget = runner.Budget(store, "b", 1.0)
    store.took = 0.001  # a fast read: every READ_EVERY
    assert not await budget.spent() and store.reads == 1
    clock[0] += runner.Budget.READ_EVERY
    assert not await budget.spent() and store.reads == 2
    store.took = 0.1  # a slow one: the next only after 0.1 / READ_SHARE = 2 s
    clock[0] += runner.Budget.READ_EVERY
    assert not await budget.spent() and store.reads == 3
    clock[0] += 1.0
    budget.add("msg_1", 0.5, True)  # (this worker's own spending is counted at once, between reads)
    store.costs[1] = 0.5
    assert not await budget.spent() and store.reads == 3 and budget.total == pytest.approx(0.501)
    budget.add("msg_1", 0.5, True)  # (a call told twice counts once)
    assert budget.total == pytest.approx(0.501)
    clock[0] += 1.0
    store.costs[0] += 0.6  # another process's spending: seen at the next read
    assert await budget.spent() and store.reads == 4 and budget.total == pytest.approx(1.101)
    budget.add("msg_2", 0.25, False)  # (told before its message is written: counted once, before and after)
    assert budget.total == pytest.approx(1.351)
    clock[0] += 2.0
    assert await budget.spent() and store.reads == 5 and budget.total == pytest.approx(1.351)  # (not yet in the store)
    store.costs[2] = 0.25
    budget.add("msg_2", 0.25, True)  # (its event: written now)
    assert budget.total == pytest.approx(1.351)
    clock[0] += 2.0
    assert await budget.spent() and store.reads == 6 and budget.total == pytest.approx(1.351)
    store.costs[0] += 1.0  # (an item with cost in the store already, run again: its new calls count at once)
    budget.add("msg_3", 1.0, True)
    assert budget.total == pytest.approx(2.351)
    clock[0] += 2.0
    assert await budget.spent() and store.reads == 7 and budget.total == pytest.approx(2.351)
