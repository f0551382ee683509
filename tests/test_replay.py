"""Replay (SPEC §12): a recorded session's steps served again, strictly compared or not."""

from __future__ import annotations

import asyncio

import pytest

from enginekit import Log, make_tools
from we0nb import (ReplayMismatchError, ReplayModel, ScriptedModel, SqlPersistence, We0Agent, We0Error, output,
                   text, tool_call, user_message)
from we0nb.testing import reasoning, usage


def run(coro):
    return asyncio.run(coro)


async def _record(p, sid="ses_rec", prompt="write f then read it"):
    log = Log()
    model = ScriptedModel([[reasoning("plan"), text("I will write."), tool_call("write", {"path": "f"}),
                            usage(10, 5)],
                           [tool_call("read", {"path": "f"}), usage(20, 3)],
                           [text("All done."), usage(30, 4)]], model_id="recorded-model")
    agent = We0Agent(model, tools=make_tools(log), persistence=p)
    await agent.invoke(session_id=sid, messages=[user_message(prompt)])
    return agent, log


def test_replay_reproduces_the_run_without_the_model(store):
    async def go():
        src, log = await _record(store)
        log2 = Log()
        replay = ReplayModel(src, "ses_rec")
        agent = We0Agent(replay, tools=make_tools(log2), persistence=store)
        result = await agent.invoke(session_id="ses_again", messages=[user_message("write f then read it")])
        assert result.text == "All done." and replay.step == 3 and replay.steps == 3
        a, b = await src.transcript("ses_rec"), await agent.transcript("ses_again")
        assert [m.text for m in a.messages] == [m.text for m in b.messages]
        assert [(p.tool, p.state.input, p.state.output) for m in b.messages for p in m.tool_parts] == \
            [(p.tool, p.state.input, p.state.output) for m in a.messages for p in m.tool_parts]
        assert [m.info.usage.input_tokens for m in b.messages if m.info.role == "assistant"] == [10, 20, 30]
        assert [p.text for p in b.messages[1].parts if p.type == "reasoning"] == ["plan"]
        assert {m.info.model_id for m in b.messages if m.info.role == "assistant"} == {"replay:recorded-model"}
        assert log2.count("write") == 1  # (the tools ran again: a replay serves the model only)

    run(go())


def test_strict_replay_fails_with_a_diff_when_the_prompt_changes(store):
    async def go():
        src, _ = await _record(store)
        agent = We0Agent(ReplayModel(store, "ses_rec"), tools=make_tools(Log()), persistence=store)
        with pytest.raises(ReplayMismatchError) as info:
            await agent.invoke(session_id="ses_x", messages=[user_message("write g then read it")])
        msg = str(info.value)
        assert info.value.step == 1 and isinstance(info.value, We0Error)
        assert "step 1" in msg and "history item 1" in msg
        assert '- "text": "write f then read it"' in msg and '+ "text": "write g then read it"' in msg
        assert "--- recorded" in msg and "+++ sent" in msg

    run(go())


def test_mismatch_in_a_tool_result_names_its_step(store):
    async def go():
        await _record(store)
        log = Log()
        tools = make_tools(log, fail=("read",))
        agent = We0Agent(ReplayModel(store, "ses_rec"), tools=tools, persistence=store)
        await asyncio.sleep(0)
        with pytest.raises(ReplayMismatchError, match="step 3 .* history item 5"):
            await agent.invoke(session_id="ses_y", messages=[user_message("write f then read it")])

    run(go())


def test_past_the_last_step_and_non_strict(store):
    async def go():
        await _record(store)
        replay = ReplayModel(store, "ses_rec", strict=False)
        agent = We0Agent(replay, tools=make_tools(Log()), persistence=store)
        result = await agent.invoke(session_id="ses_ns", messages=[user_message("something else")])
        assert result.text == "All done."
        with pytest.raises(ReplayMismatchError, match="step 4 was asked for.*recorded 3 step"):
            await agent.invoke(session_id="ses_ns", messages=[user_message("more")])

    run(go())


def test_structured_output_replays(store):
    from pydantic import BaseModel

    class Answer(BaseModel):
        city: str

    async def go():
        src = We0Agent(ScriptedModel([[output({"city": "Paris"})]]), output_type=Answer, persistence=store)
        await src.invoke(session_id="ses_o", messages=[user_message("capital?")])
        again = We0Agent(ReplayModel(store, "ses_o"), output_type=Answer, persistence=store)
        r = await again.invoke(session_id="ses_o2", messages=[user_message("capital?")])
        assert r.output == Answer(city="Paris")

    run(go())


def test_bad_sources_fail_in_one_line_writing_nothing(tmp_path, store):
    async def go():
        agent = We0Agent(ReplayModel(store, "ses_none"), persistence=store)
        with pytest.raises(ValueError, match="the source has no session 'ses_none'"):
            await agent.invoke(session_id="ses_new", messages=[user_message("hi")])
        assert (await agent.transcript("ses_new")).session is None

    run(go())
    with pytest.raises(TypeError, match="expected an agent, a persistence or a database URL"):
        ReplayModel(42, "ses_a")


def test_replay_from_a_url_in_another_store(tmp_path):
    url = f"sqlite:///{tmp_path / 'rec.db'}"

    async def go():
        p = SqlPersistence(url)
        await _record(p)
        await p.close()
        agent = We0Agent(ReplayModel(url, "ses_rec"), tools=make_tools(Log()))
        r = await agent.invoke(session_id="s", messages=[user_message("write f then read it")])
        assert r.text == "All done."

    run(go())


def test_a_longer_history_than_recorded_is_a_mismatch(store):
    async def go():
        await _record(store)
        first = We0Agent(ScriptedModel([[text("earlier answer")]]), persistence=store)
        await first.invoke(session_id="ses_long", messages=[user_message("before")])
        agent = We0Agent(ReplayModel(store, "ses_rec"), tools=make_tools(Log()), persistence=store)
        with pytest.raises(ReplayMismatchError, match=r"step 1 .*history item 1 \(recorded 1 item\(s\), sent 3\)"):
            await agent.invoke(session_id="ses_long", messages=[user_message("write f then read it")])

    run(go())


def test_recorded_tools_serve_outputs_without_executing(store):
    async def go():
        await _record(store)
        log = Log()
        replay = ReplayModel(store, "ses_rec")
        agent = We0Agent(replay, tools=replay.recorded_tools(make_tools(log)), persistence=store)
        r = await agent.invoke(session_id="ses_rt", messages=[user_message("write f then read it")])
        assert r.text == "All done." and log.calls == []  # no tool body ran
        outs = [p.state.output for m in (await agent.transcript("ses_rt")).messages for p in m.tool_parts]
        assert outs == ["wrote f", "content of f"]
        # a call the recording lacks fails clearly (the model sees the error)
        other = ReplayModel(store, "ses_rec", strict=False)
        bad = We0Agent(ScriptedModel([[tool_call("write", {"path": "z"}, call_id="call_new")], [text("ok")]]),
                       tools=other.recorded_tools(make_tools(log)), persistence=store)
        await bad.invoke(session_id="ses_bad", messages=[user_message("x")])
        part = (await bad.transcript("ses_bad")).messages[1].tool_parts[0]
        assert part.state.status == "error" and "has no call 'call_new' of tool 'write'" in part.state.error
        assert log.calls == []

    run(go())


def test_a_url_without_a_database_is_refused_and_not_created(tmp_path):
    missing = tmp_path / "nothing.db"
    with pytest.raises(ValueError, match="there is no database at"):
        ReplayModel(f"sqlite:///{missing}", "ses_a")
    assert not missing.exists()
    with pytest.raises(ValueError, match="is not a database URL"):
        ReplayModel("not a url", "ses_a")


async def _record_compacting(p):
    """A session whose first turn compacted (ended 'compact') and whose second answered."""
    model = ScriptedModel([[text("A long answer."), usage(input_tokens=900)], [text("Summary: long answer given.")],
                           [text("Continuing.")]], context_window=1000)
    agent = We0Agent(model, persistence=p)
    first = await agent.invoke(session_id="ses_c", messages=[user_message("do")])
    second = await agent.invoke(session_id="ses_c", messages=[user_message("more")])
    assert (first.result, second.text) == ("compact", "Continuing.")


def test_a_replay_with_the_recorded_context_window_compacts_where_the_recording_did(store):
    async def go():
        await _record_compacting(store)
        replay = ReplayModel(store, "ses_c", context_window=1000)
        agent = We0Agent(replay, persistence=store)
        first = await agent.invoke(session_id="ses_c2", messages=[user_message("do")])
        second = await agent.invoke(session_id="ses_c2", messages=[user_message("more")])
        assert (first.result, second.result, second.text) == ("compact", "stop", "Continuing.")
        assert replay.step == replay.steps == 3

    run(go())


def test_a_strict_replay_never_serves_a_recorded_summary_as_an_answer(store):
    async def go():
        await _record_compacting(store)
        agent = We0Agent(ReplayModel(store, "ses_c"), persistence=store)  # (no context window: no compaction)
        first = await agent.invoke(session_id="ses_c3", messages=[user_message("do")])
        assert first.text == "A long answer."
        with pytest.raises(ReplayMismatchError) as info:
            await agent.invoke(session_id="ses_c3", messages=[user_message("more")])
        assert info.value.step == 2 and "compacted its history here" in str(info.value)
        assert "context_window" in str(info.value)

    run(go())


def test_a_loose_replay_skips_the_summaries_the_agent_did_not_ask_for(store):
    async def go():
        await _record_compacting(store)
        replay = ReplayModel(store, "ses_c", strict=False)
        agent = We0Agent(replay, persistence=store)
        await agent.invoke(session_id="ses_c4", messages=[user_message("do")])
        second = await agent.invoke(session_id="ses_c4", messages=[user_message("more")])
        assert second.text == "Continuing."
        assert len(replay.requests) == 2 and replay.step == 3  # (two calls, one summary skipped)

    run(go())


def test_a_recorded_model_failure_fails_again_in_the_replay(store):
    from we0nb import FunctionModel, ModelError

    async def go():
        calls = []

        def failing(request):
            calls.append(request)
            if len(calls) == 1:
                raise RuntimeError("provider down")
            return [text("recovered answer")]

        agent = We0Agent(FunctionModel(failing, model_id="flaky"), persistence=store)
        with pytest.raises(ModelError):
            await agent.invoke(session_id="ses_f", messages=[user_message("hi")])
        assert (await agent.invoke(session_id="ses_f", mode="resume")).text == "recovered answer"

        replay = ReplayModel(store, "ses_f")
        again = We0Agent(replay, persistence=store)
        with pytest.raises(ModelError) as info:  # (it answered nothing the first time: no empty answer now)
            await again.invoke(session_id="ses_f2", messages=[user_message("hi")])
        assert "RuntimeError: provider down" in str(info.value) and replay.step == 1
        assert (await again.invoke(session_id="ses_f2", mode="resume")).text == "recovered answer"
        assert replay.step == replay.steps == 2

    run(go())


def test_replay_context_window_must_be_a_positive_int():
    for bad in (0, -5, 1.5, "1000", True):
        with pytest.raises(ValueError, match="context_window"):
            ReplayModel(None, "ses_x", context_window=bad)


def test_a_call_the_recorded_run_was_stopped_in_is_served_cut_never_as_an_answer(store):
    """A step aborted while it streamed: its fragment, then a failure (not ``stop`` and the
    fragment as the answer); a resume is served the next recorded step, strictly compared."""
    from we0nb import ModelError

    async def go():
        agent = We0Agent(ScriptedModel([[text(["par", "tial"])]], delay=0.05), persistence=store)
        abort = asyncio.Event()
        with pytest.raises(asyncio.CancelledError):
            async for ev in agent.stream(abort=abort, session_id="ses_cut", messages=[user_message("q")]):
                if ev["type"] == "text-delta":
                    abort.set()
        unresumed = ReplayModel(store, "ses_cut")  # (read before the recorded run was resumed)
        await unresumed.prepare()
        await We0Agent(ScriptedModel([[text("final")]]), persistence=store).invoke(session_id="ses_cut", mode="resume")

        replay = ReplayModel(store, "ses_cut")
        again = We0Agent(replay, persistence=store)
        with pytest.raises(ModelError, match="cut off"):
            await again.invoke(session_id="ses_cut2", messages=[user_message("q")])
        first = (await again.transcript("ses_cut2")).messages[1]
        assert first.text == "par" and first.info.finish_reason is None and first.info.time.completed is None
        resumed = await again.invoke(session_id="ses_cut2", mode="resume")
        assert resumed.text == "final" and replay.step == replay.steps == 2

        with pytest.raises(ModelError, match="cut off"):  # (a recording still cut at its end: the same)
            await We0Agent(unresumed, persistence=store).invoke(session_id="ses_cut3", messages=[user_message("q")])

    run(go())


def test_a_call_cut_after_a_tool_call_streamed_is_cut_and_one_cut_while_its_tools_ran_is_whole(store):
    """A tool call that streamed before the cut never ran: the step is served cut (its call left for
    the replay's resume, as the recorded resume found it); a step cut while its call ran had a
    whole reply: served as its calls."""
    from we0nb import ModelError, tool

    ran: list[str] = []

    @tool(side_effects=False)
    async def look(q: str) -> str:
        """Read-only."""
        ran.append(q)
        await asyncio.sleep(0.2)
        return "seen"

    async def record(sid: str, script: list, when) -> None:
        agent = We0Agent(ScriptedModel(script, delay=0.02), tools=[look], persistence=store)
        abort = asyncio.Event()
        with pytest.raises(asyncio.CancelledError):
            async for ev in agent.stream(abort=abort, session_id=sid, messages=[user_message("q")]):
                if when(ev):
                    abort.set()
        await We0Agent(ScriptedModel([[text("final")]]), tools=[look], persistence=store).invoke(
            session_id=sid, mode="resume")

    async def go():
        await record("ses_cs", [[tool_call("look", {"q": "a"}), text(["x", "y", "z"])]],
                     lambda ev: ev["type"] == "text-delta")
        await record("ses_ct", [[tool_call("look", {"q": "b"})], [text("z")]],
                     lambda ev: ev["type"] == "tool" and ev["part"].state.status == "running")
        ran.clear()

        replay = ReplayModel(store, "ses_cs")
        again = We0Agent(replay, tools=[look], persistence=store)
        with pytest.raises(ModelError, match="cut off"):
            await again.invoke(session_id="ses_cs2", messages=[user_message("q")])
        assert ran == []  # (the call that streamed before the cut is not run as if the reply were whole)
        assert (await again.invoke(session_id="ses_cs2", mode="resume")).text == "final"
        assert ran == ["a"] and replay.step == 2  # (recalled by the resume, as in the recording)

        ran.clear()
        whole = We0Agent(ReplayModel(store, "ses_ct"), tools=[look], persistence=store)
        assert (await whole.invoke(session_id="ses_ct2", messages=[user_message("q")])).text == "final"
        assert ran == ["b"]

    run(go())
