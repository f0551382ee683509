"""Scoring batches (SPEC §14): functions and judges, persisted, resumable; the frames."""

from __future__ import annotations

import asyncio
import gc

import pandas as pd
import pytest

from we0nb import (FunctionModel, Score, We0Agent, experiments_df, judge, plot_experiments, scorer, scores_df, text,
                   tool, tool_call)
from we0nb.batch.judge import Verdict, judge_session_id
from we0nb.models.base import UserTurn

STORES = ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
PROMPTS = ["2+2", "3+3", "5+5", "boom"]


def run(coro):
    return asyncio.run(coro)


@tool(side_effects=False)
def calc(expr: str) -> str:
    return str(eval(expr, {}))  # (test input only)


def solver(p, wrong: bool = False) -> We0Agent:
    """Calls ``calc`` then answers its result (off by one when ``wrong``); fails on 'boom'."""

    def reply(request):
        prompt = next(m.text for m in request.messages if isinstance(m, UserTurn))
        if prompt == "boom":
            raise RuntimeError("the model failed")
        results = [m for m in request.messages if getattr(m, "role", "") == "tool"]
        if not results:
            return [tool_call("calc", {"expr": prompt})]
        value = int(results[-1].content) + (1 if wrong else 0)
        return [text(str(value))]

    return We0Agent(FunctionModel(reply), tools=[calc], persistence=p)


def exact(case) -> bool:
    return case.text == str(case.expected)


def closeness(case) -> float:
    return 1.0 / (1 + abs(int(case.text) - int(case.expected)))


EXPECTED = [4, 6, 10, 0]


def verdicts(calls: list[str], fail_first: int = 0):
    """A judge model: passes answers whose text equals EXPECTED, as structured output."""
    state = {"left": fail_first}

    async def reply(request):
        question = next(m.text for m in request.messages if isinstance(m, UserTurn))
        calls.append(question)
        if state["left"] > 0:
            state["left"] -= 1
            await asyncio.sleep(30)  # (cancelled by the test: a judge run cut off)
        answer = question.split("ANSWER:\n", 1)[1].split("\n\n", 1)[0]
        expected = question.split("EXPECTED:\n", 1)[1].strip()
        from we0nb import output
        return [output(Verdict(passed=answer == expected, reason=f"{answer} vs {expected}"))]

    return FunctionModel(reply, model_id="judge-model")


def test_function_scorers_persist_and_skip(store):
    async def go():
        agent = solver(store)
        batch = await agent.batch(PROMPTS, name="b_right", progress=False)
        got = await batch.score([exact, scorer(closeness, name="close")], expected=EXPECTED, progress=False)
        assert len(got.scored) == 6 and got.skipped == 0 and got.errors == []  # 'boom' failed: not scored
        again = await batch.score([exact], expected=EXPECTED, progress=False)
        assert again.scored == [] and again.skipped == 3
        return batch

    run(go())
    df = scores_df(store, batch="b_right")
    assert list(df.columns) == ["item", "session_id", "scorer", "value", "passed", "reason", "judge_session_id"]
    assert len(df) == 6 and set(df["scorer"]) == {"exact", "close"}
    ex = df[df["scorer"] == "exact"]
    assert list(ex["value"]) == [1.0, 1.0, 1.0] and ex["passed"].all()
    assert df[df["scorer"] == "close"]["passed"].isna().all()  # a float sets the value only


def test_experiments_df_compares_two_batches_with_intervals(store):
    async def go():
        good, bad = solver(store), solver(store, wrong=True)
        b1 = await good.batch(PROMPTS[:3], name="exp_good", progress=False)
        b2 = await bad.batch(PROMPTS[:3], name="exp_bad", progress=False)
        for b in (b1, b2):
            await b.score([exact, closeness], expected=EXPECTED[:3], progress=False)

    run(go())
    df = experiments_df(store, ["exp_good", "exp_bad"])
    assert list(df.columns) == ["batch", "scorer", "n", "mean", "pass_rate", "ci_low", "ci_high", "cost", "duration"]
    assert list(zip(df["batch"], df["scorer"])) == [("exp_good", "closeness"), ("exp_good", "exact"),
                                                    ("exp_bad", "closeness"), ("exp_bad", "exact")]
    row = df.set_index(["batch", "scorer"])
    assert row.loc[("exp_good", "exact"), "mean"] == 1.0 and row.loc[("exp_bad", "exact"), "mean"] == 0.0
    assert (row.loc[("exp_good", "exact"), "ci_low"], row.loc[("exp_good", "exact"), "ci_high"]) == (1.0, 1.0)
    assert row.loc[("exp_bad", "closeness"), "mean"] == 0.5 and pd.isna(row.loc[("exp_bad", "closeness"), "pass_rate"])
    assert (df["n"] == 3).all() and df["cost"].isna().all()  # (an unpriced model: unknown, never 0)
    assert (df["duration"] > pd.Timedelta(0)).all()
    fig = plot_experiments(df)
    assert len(fig.axes) == 2


def test_experiments_df_cost_is_the_sum_of_the_items_costs_and_nan_when_unknown(store):
    from we0nb.testing import usage

    def reply(request):  # priced at $1 per million input tokens and $2 per million output: $2 a call
        return [text("ok"), usage(1_000_000, 500_000)]

    def answered(case) -> bool:
        return case.text == "ok"

    async def go():
        for name, price in (("cost_known", (1.0, 2.0)), ("cost_unknown", None)):
            agent = We0Agent(FunctionModel(reply, price=price), persistence=store)
            b = await agent.batch(["a", "b", "c"], name=name, progress=False)
            await b.score([answered], progress=False)

    run(go())
    df = experiments_df(store, ["cost_known", "cost_unknown"]).set_index("batch")
    assert df.loc["cost_known", "cost"] == pytest.approx(3 * 2.0)  # the three items' calls, summed
    assert pd.isna(df.loc["cost_unknown", "cost"])  # an unpriced model: unknown, never 0
    assert (df["n"] == 3).all() and (df["mean"] == 1.0).all()


def test_bootstrap_interval_brackets_the_mean():
    from we0nb.notebook.score_frames import bootstrap_ci

    values = [0, 1] * 50
    lo, hi = bootstrap_ci(values)
    assert lo < 0.5 < hi and hi - lo < 0.3
    assert bootstrap_ci(values) == (lo, hi)  # (a fixed seed: one interval for one set of scores)


def test_judge_verdicts_are_sessions_and_resume_after_an_abort(store):
    calls: list[str] = []

    async def go():
        agent = solver(store)
        batch = await agent.batch(PROMPTS[:3], name="b_judge", progress=False)
        j = judge(verdicts(calls, fail_first=1), "The answer is the number expected.", name="judge")
        task = asyncio.ensure_future(batch.score([j], expected=["4", "7", "10"], progress=False, concurrency=1))
        while not calls:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        task.cancel()  # a scoring cut off while the first verdict runs
        with pytest.raises(asyncio.CancelledError):
            await task
        assert scores_df(store, batch="b_judge").empty  # nothing was written
        sid = judge_session_id("b_judge", 0, "judge")
        assert (await agent.transcript(sid)).needs_resume  # the cut verdict is a session, unfinished
        got = await batch.score([j], expected=["4", "7", "10"], progress=False)
        assert got.errors == [] and [r.passed for r in got.scored] == [True, False, True]
        assert len(calls) == 4  # the cut verdict resumed once, the others asked once
        again = await batch.score([j], expected=["4", "7", "10"], progress=False)
        assert again.skipped == 3 and len(calls) == 4  # scored: no model call
        verdict = await agent.transcript(got.scored[1].judge_session_id)
        assert verdict.session is not None and "3+3" in verdict.messages[0].text

    run(go())
    df = scores_df(store, batch="b_judge")
    assert list(df["reason"]) == ["4 vs 4", "6 vs 7", "10 vs 10"]
    assert df["judge_session_id"].str.startswith("judge_").all()


def test_a_scorings_verdicts_share_one_abort_watcher(store, monkeypatch):
    """Each run watches its abort event with a task; a scoring's verdicts share the scoring's
    event, so 3 verdicts running together make one watcher, not three ('boom' failed: not scored)."""
    import we0nb.engine.abort as abort_mod

    made = []
    original = abort_mod._Watcher.__init__

    def counted(self, event):
        made.append(event)
        original(self, event)

    async def go():
        agent = solver(store)
        batch = await agent.batch(PROMPTS, name="b_watch", progress=False)
        monkeypatch.setattr(abort_mod._Watcher, "__init__", counted)
        async def slow(request):  # (the verdicts overlap: a watcher lives while any run uses it)
            await asyncio.sleep(0.05)
            from we0nb import output
            return [output(Verdict(passed=True, reason="ok"))]

        got = await batch.score([judge(FunctionModel(slow), "Any answer passes.")], concurrency=4, progress=False)
        assert len(got.scored) == 3 and not got.errors

    run(go())
    assert len(made) == 1


def test_a_verdict_frees_its_slot_after_its_models_last_call(store, monkeypatch):
    """At concurrency 1 the next verdict's model call starts while the verdict before it still
    writes its end (here held back until that call came, at most 3 s): the slot bounds model
    calls, as a batch's concurrency does, and a verdict's last commit is off its path."""
    calls: list[int] = []
    second_called = asyncio.Event()
    waited_for_it: list[bool] = []

    async def go():
        agent = solver(store)
        batch = await agent.batch(PROMPTS[:2], name="b_slot", progress=False)
        original = store.commit

        async def commit(writes, **kw):
            ends = [m for m, _, _ in writes if m is not None and m.role == "assistant" and m.time.completed]
            if ends and ends[0].session_id == judge_session_id("b_slot", 0, "judge") and not waited_for_it:
                try:  # (the first verdict's step end: it waits for the second verdict's call)
                    await asyncio.wait_for(second_called.wait(), 3)
                    waited_for_it.append(True)
                except asyncio.TimeoutError:
                    waited_for_it.append(False)
            return await original(writes, **kw)

        monkeypatch.setattr(store, "commit", commit)

        async def verdict(request):
            calls.append(len(calls) + 1)
            if len(calls) == 2:
                second_called.set()
            from we0nb import output
            return [output(Verdict(passed=True, reason="ok"))]

        got = await batch.score([judge(FunctionModel(verdict), "Any answer passes.")], concurrency=1, progress=False)
        assert len(got.scored) == 2 and not got.errors

    run(go())
    assert calls == [1, 2] and waited_for_it == [True]


def test_judge_sessions_are_one_per_item_and_follow_item_order():
    # (a scoring's verdicts side by side in every index keyed by session: see judge_session_id)
    ids = [judge_session_id("b", i, "judge") for i in range(1200)]
    assert len(set(ids)) == 1200 and ids == sorted(ids)
    assert ids[7] == judge_session_id("b", 7, "judge")  # the same on every call: a verdict resumes
    others = {judge_session_id("b", 7, "other"), judge_session_id("c", 7, "judge"), judge_session_id("b\x00", 7, "")}
    assert ids[7] not in others and len(others) == 3


def test_a_raising_scorer_records_nothing_for_that_item_and_is_retried(store):
    flaky_on = {1}

    def flaky(case) -> Score:
        if case.item in flaky_on:
            raise ValueError("cannot tell")
        return Score(0.5, passed=True, reason="fine")

    async def go():
        batch = await solver(store).batch(PROMPTS[:3], name="b_flaky", progress=False)
        got = await batch.score([flaky], progress=False)
        assert [(e.item, e.scorer) for e in got.errors] == [(1, "flaky")] and "cannot tell" in got.errors[0].error
        assert "errors=1" in repr(got)
        flaky_on.clear()
        again = await batch.score([flaky], progress=False)
        assert [r.item for r in again.scored] == [1] and again.skipped == 2

    run(go())


def test_bad_input_is_one_line_and_writes_nothing(store, caplog):
    async def go():
        batch = await solver(store).batch(PROMPTS[:3], name="b_bad", progress=False)
        with pytest.raises(ValueError, match="2 values were given for a batch of 3 items"):
            await batch.score([exact], expected=[1, 2], progress=False)

        def wordy(case):
            return "yes"

        with pytest.raises(TypeError, match="scorer 'wordy' returned str .*return a bool, a float or a Score"):
            await batch.score([exact, wordy], expected=EXPECTED[:3], progress=False)
        gc.collect()  # (several scorings failed at once: every failure was read, none logged as never retrieved)
        assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]
        assert scores_df(store, batch="b_bad").empty
        with pytest.raises(ValueError, match="No batch named 'nope'"):
            scores_df(store, batch="nope")
        with pytest.raises(TypeError, match="expected a we0nb model"):
            judge("gpt", "rubric")

        class Plain(FunctionModel):
            structured_output = False

        with pytest.raises(ValueError, match="cannot return structured output"):
            judge(Plain(lambda r: "x"), "rubric")

    run(go())


def test_expected_from_a_series_is_taken_by_position(store):
    async def go():
        batch = await solver(store).batch(PROMPTS[:3], name="b_series", progress=False)
        series = pd.Series([4, 6, 10], index=[10, 20, 30])
        got = await batch.score([exact], expected=series, progress=False)
        assert [r.value for r in got.scored] == [1.0, 1.0, 1.0]

    run(go())


def test_case_has_prompt_text_and_tool_calls(store):
    seen = []

    def look(case):
        seen.append((case.item, case.prompt, case.text, case.tool_calls, case.output, case.expected))
        return True

    async def go():
        batch = await solver(store).batch(["2+2"], name="b_case", progress=False)
        await batch.score([look], progress=False)

    run(go())
    assert seen == [(0, "2+2", "4", ["calc"], None, None)]


def test_a_cases_output_is_the_structured_output_the_run_returned(store):
    """``case.output`` is what ``RunResult.output`` was (the agent's output type), not its stored JSON;
    scored with an agent whose type no longer accepts it, the decoded JSON."""
    from pydantic import BaseModel

    from we0nb import output

    class Answer(BaseModel):
        value: int

    class Other(BaseModel):
        name: str

    seen = []

    def look(case):
        seen.append(case.output)
        return True

    async def go():
        agent = We0Agent(FunctionModel(lambda request: [output(Answer(value=4))]), persistence=store,
                         output_type=Answer)
        batch = await agent.batch(["2+2"], name="b_typed", progress=False)
        await batch.score([look], progress=False)
        asked: list[str] = []
        verdict = await batch.score([judge(verdicts(asked), "Is it right?")], expected=['{"value": 4}'],
                                    progress=False)
        assert "ANSWER:\n{\"value\": 4}\n" in asked[0] and not verdict.errors and verdict.df["passed"].tolist() == [True]
        batch.agent = We0Agent(FunctionModel(lambda request: []), persistence=store, output_type=Other)
        await batch.score([scorer(look, name="again")], progress=False)

    run(go())
    assert seen == [Answer(value=4), {"value": 4}] and type(seen[0]) is Answer


def test_a_cases_output_is_the_output_types_instance_for_a_dataclass_and_an_aliased_model(store):
    import dataclasses

    from pydantic import BaseModel, Field

    from we0nb import output

    @dataclasses.dataclass
    class Point:
        x: int

    class Aliased(BaseModel):
        value: int = Field(alias="Value")

    seen = []

    def look(case):
        seen.append(case.output)
        return True

    async def go():
        # (what a model sends: the output tool's arguments, by the schema's names — an alias for Aliased)
        for kind, answer, name in ((Point, {"x": 2}, "b_dataclass"), (Aliased, {"Value": 5}, "b_alias")):
            agent = We0Agent(FunctionModel(lambda request, a=answer: [output(a)]), persistence=store,
                             output_type=kind)
            batch = await agent.batch(["q"], name=name, progress=False)
            assert batch.items[0].status == "stop", batch.items[0].error
            await batch.score([scorer(look, name=f"look_{name}")], progress=False)

    run(go())
    assert seen == [Point(x=2), Aliased(Value=5)] and [type(x) for x in seen] == [Point, Aliased]


def test_a_case_without_tool_calls_is_made_without_reading_its_transcript(store, monkeypatch):
    seen, read = [], []

    def look(case):
        seen.append((case.item, case.text, case.tool_calls))
        return True

    def reply(request):  # a tool call for "2+2" only; "hi" is answered at once
        prompt = next(m.text for m in request.messages if isinstance(m, UserTurn))
        if prompt == "2+2" and not any(getattr(m, "role", "") == "tool" for m in request.messages):
            return [tool_call("calc", {"expr": prompt})]
        return [text("4" if prompt == "2+2" else "hello")]

    async def go():
        batch = await We0Agent(FunctionModel(reply), tools=[calc], persistence=store).batch(
            ["2+2", "hi"], name="b_light", progress=False)
        loads = store.load_transcript

        async def counted(session_id):
            read.append(session_id)
            return await loads(session_id)

        monkeypatch.setattr(store, "load_transcript", counted)
        await batch.score([look], progress=False)
        return batch

    batch = run(go())
    assert sorted(seen) == [(0, "4", ["calc"]), (1, "hello", [])]
    assert read == [batch.items[0].session_id]  # the item with a call only


def test_sync_scorers_run_in_worker_threads_with_the_scoring_concurrency():
    import threading

    from we0nb import MemoryPersistence

    loop_thread = threading.get_ident()
    barrier = threading.Barrier(4, timeout=20)  # (four verdicts in flight at once, or it breaks)
    threads: set[int] = set()

    def blocking(case) -> bool:
        threads.add(threading.get_ident())
        barrier.wait()
        return True

    async def go():
        b = await We0Agent(FunctionModel(lambda r: [text("x")]), persistence=MemoryPersistence()).batch(
            ["a", "b", "c", "d"], name="threads", progress=False)
        return await b.score([blocking], concurrency=8, progress=False)

    result = run(go())
    assert result.errors == [] and len(result.scored) == 4
    assert loop_thread not in threads and len(threads) == 4


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_scorer_raising_cancelled_error_is_an_error_of_its_item(kind):
    from we0nb import MemoryPersistence

    def sync_cancel(case) -> bool:
        raise asyncio.CancelledError()

    async def async_cancel(case) -> bool:
        raise asyncio.CancelledError()

    async def go():
        b = await We0Agent(FunctionModel(lambda r: [text("x")]), persistence=MemoryPersistence()).batch(
            ["a", "b"], name="cancels", progress=False)
        return await b.score([scorer(sync_cancel if kind == "sync" else async_cancel, name="grader")],
                             progress=False)

    result = run(go())
    assert [(e.item, e.scorer) for e in result.errors] == [(0, "grader"), (1, "grader")]
    assert all(e.error.startswith("CancelledError") for e in result.errors) and result.scored == []
