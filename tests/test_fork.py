"""Fork (SPEC §12): a session copied up to a message into a new one, executing nothing.

Each kind of point — a user message, a finished assistant message, an assistant message aborted
mid-tool with pending and running calls — on memory, SQLite and PostgreSQL, with counters showing
that no tool ran and no model was called; then the fork run on by another model."""

from __future__ import annotations

import asyncio

import pytest

from enginekit import Log, make_tools, seed, state
from we0nb._ids import call_key
from we0nb import ScriptedModel, We0Agent, sessions_df, text, tool_call, user_message

STORES = ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def run(coro):
    return asyncio.run(coro)


async def _finished(agent: We0Agent, sid: str) -> None:
    await agent.invoke(session_id=sid, messages=[user_message("write f")])


def _agent(p, log: Log, steps=()) -> We0Agent:
    return We0Agent(ScriptedModel(list(steps)), tools=make_tools(log), persistence=p)


def test_fork_at_user_message_then_resume_answers_afresh(store):
    log = Log()
    src = _agent(store, log, [[tool_call("write", {"path": "f"})], [text("done")]])

    async def go():
        await _finished(src, "ses_src")
        before = await src.transcript("ses_src")
        user = before.messages[0].info.id
        fid = await src.fork("ses_src", at=user)
        tr = await src.transcript(fid)
        assert [m.info.role for m in tr.messages] == ["user"]
        assert tr.messages[0].text == "write f" and tr.messages[0].info.id != user
        assert tr.session.forked_from == "ses_src" and tr.session.forked_at == user
        assert log.count("write") == 1 and len(src.model.requests) == 2  # nothing ran
        other = _agent(store, log, [[text("another answer")]])
        result = await other.invoke(mode="resume", session_id=fid)
        assert result.text == "another answer"
        assert [m.role for m in other.model.requests[0].messages] == ["user"]
        after = await src.transcript("ses_src")
        assert after.model_dump() == before.model_dump()  # the source is not changed

    run(go())


def test_fork_of_finished_session_copies_all_keeps_outputs(store):
    log = Log()
    src = _agent(store, log, [[tool_call("write", {"path": "f"})], [text("done")]])

    async def go():
        await _finished(src, "ses_a")
        fid = await src.fork("ses_a", new_session_id="ses_b")
        assert fid == "ses_b"
        tr = await src.transcript("ses_b")
        assert tr.session.forked_from == "ses_a" and tr.session.forked_at is None
        assert [m.text for m in tr.messages] == [m.text for m in (await src.transcript("ses_a")).messages]
        call = tr.messages[1].tool_parts[0]
        assert call.state.status == "completed" and call.state.output == "wrote f"
        assert not tr.needs_resume
        more = _agent(store, log, [[tool_call("write", {"path": "g"})], [text("again")]])
        await more.invoke(session_id="ses_b", messages=[user_message("and g")])
        keys = {}
        for sid in ("ses_a", "ses_b"):
            parts = [p for m in (await more.transcript(sid)).messages for p in m.tool_parts]
            keys[sid] = [p.state.metadata["idempotency_key"] for p in parts]
        assert keys["ses_b"][0] == keys["ses_a"][0]  # the copy keeps the source's key (what ran there)
        assert keys["ses_b"][1] not in keys["ses_a"]  # the fork's own call has its own
        assert log.count("write") == 2  # f once (the source), g once (the fork)

    run(go())


def test_fork_mid_tool_interrupts_pending_and_running(store):
    log = Log()
    agent = _agent(store, log, [[text("recovered")]])

    async def go():
        ids = await seed(store, "ses_cut", [("write", state("completed")), ("write", state("running")),
                                            ("rm", state("pending")), ("read", state("pending"))])
        before = await agent.transcript("ses_cut")
        at = before.messages[-1].info.id
        fid = await agent.fork("ses_cut", at=at)
        tr = await agent.transcript(fid)
        last = tr.messages[-1]
        assert last.info.time.completed is not None
        assert last.info.error.metadata == {"recovered": True, "mode": "fork"}
        states = [p.state for p in last.tool_parts]
        assert states[0].status == "completed"
        for st, doubt in zip(states[1:], (True, False, False)):
            assert st.status == "error"
            assert st.metadata["interrupted"] is True and st.metadata["reason"] == "fork"
            assert st.metadata["in_doubt"] is doubt
        assert log.calls == [] and agent.model.requests == []  # nothing executed, no model called
        source = await agent.transcript("ses_cut")
        assert source.model_dump() == before.model_dump()
        src_keys = [call_key("ses_cut", p.id) for p in source.messages[-1].tool_parts]
        assert [s.metadata["idempotency_key"] for s in states] == src_keys  # (seeded without keys)
        # the fork runs on: the model sees every result, the read is not recalled in the fork
        result = await agent.invoke(mode="resume", session_id=fid)
        assert result.text == "recovered" and log.calls == []
        assert [m.role for m in agent.model.requests[0].messages].count("tool") == 4
        assert ids  # (seeded)

    run(go())


def test_fork_respects_revert_and_refuses_hidden_or_unknown(store):
    log = Log()
    src = _agent(store, log, [[text("one")], [text("two")]])

    async def go():
        await src.invoke(session_id="ses_r", messages=[user_message("a")])
        await src.invoke(session_id="ses_r", messages=[user_message("b")])
        tr = await src.transcript("ses_r")
        hidden = tr.messages[2].info.id
        await src.revert("ses_r", hidden)
        n = len(await src.persistence.list_sessions())
        with pytest.raises(ValueError, match="hidden by a revert"):
            await src.fork("ses_r", at=hidden)
        with pytest.raises(ValueError, match="is not in session"):
            await src.fork("ses_r", at="msg_nope")
        with pytest.raises(ValueError, match="does not exist"):
            await src.fork("ses_missing")
        with pytest.raises(ValueError, match="exists already"):
            await src.fork("ses_r", new_session_id="ses_r2") and await src.fork("ses_r", new_session_id="ses_r2")
        assert len(await src.persistence.list_sessions()) == n + 1  # only the one good fork was written
        fid = await src.fork("ses_r")
        assert [m.text for m in (await src.transcript(fid)).messages] == ["a", "one"]

    run(go())


def test_sessions_df_shows_lineage(store):
    log = Log()
    src = _agent(store, log, [[text("one")]])

    async def go():
        await src.invoke(session_id="ses_l", messages=[user_message("a")])
        at = (await src.transcript("ses_l")).messages[0].info.id
        await src.fork("ses_l", at=at, new_session_id="ses_l2")

    run(go())
    df = sessions_df(store).set_index("session_id")
    assert df.loc["ses_l2", "forked_from"] == "ses_l"
    assert df.loc["ses_l2", "forked_at"].startswith("msg_")
    assert df["forked_from"].isna()["ses_l"]


def test_new_ids_in_bulk_sort_between_single_ids():
    from we0nb._ids import id_time, new_id, new_ids

    ids = [new_id("a"), *new_ids(["msg", "prt", "prt"]), new_id("b")]
    times = [id_time(i) for i in ids]
    assert times == sorted(times) and len(set(times)) == len(times)
    assert [i.split("_")[0] for i in ids[1:4]] == ["msg", "prt", "prt"] and new_ids([]) == []


def test_fork_of_a_session_awaiting_approval_interrupts_the_awaiting_call(store):
    from we0nb.messages import ToolApproval

    log = Log()
    agent = _agent(store, log)

    async def go():
        ids = await seed(store, "ses_wait", [("write", state("pending"))], completed=True)
        tr = await agent.transcript("ses_wait")
        part = tr.messages[-1].tool_parts[0]
        waiting = part.model_copy(update={"approval": "requested", "approval_detail": ToolApproval(requested=1.0)})
        from sql_support import put
        await put(store, None, waiting)
        assert (await agent.pending_approvals("ses_wait"))
        fid = await agent.fork("ses_wait")
        call = (await agent.transcript(fid)).messages[-1].tool_parts[0]
        assert call.interrupt_reason == "fork" and call.state.metadata["in_doubt"] is False
        assert await agent.pending_approvals(fid) == [] and log.calls == []
        assert (await agent.pending_approvals("ses_wait"))  # the source still waits for its decision
        assert ids

    run(go())


def test_tool_calls_df_shows_the_fork_reason(store):
    from we0nb import tool_calls_df

    agent = _agent(store, Log())

    async def go():
        await seed(store, "ses_df", [("write", state("running")), ("rm", state("pending"))])
        return await agent.fork("ses_df", new_session_id="ses_df_fork")

    run(go())
    calls = tool_calls_df(store, "ses_df_fork")
    assert list(calls["interrupt_reason"].astype(str)) == ["fork", "fork"]
    assert "fork" in list(calls["interrupt_reason"].cat.categories)


def test_a_fork_at_a_mid_turn_compaction_summary_resumes_the_turn(store):
    from we0nb.testing import usage

    log = Log()
    src = We0Agent(ScriptedModel([[text("Working."), tool_call("write", {"path": "f"}), usage(input_tokens=900)],
                                  [text("Summary: wrote f.")]], context_window=1000),
                   tools=make_tools(log), persistence=store)

    async def go():
        first = await src.invoke(session_id="ses_cmp", messages=[user_message("write f")])
        assert first.result == "compact"  # (mid-turn: the summary, then the turn's user message again)
        t = await src.transcript("ses_cmp")
        summary = next(m for m in t.messages if m.info.role == "assistant" and m.info.summary)
        fid = await src.fork("ses_cmp", at=summary.info.id)
        again = We0Agent(ScriptedModel([[text("f is written.")]]), tools=make_tools(log), persistence=store)
        return await again.invoke(mode="resume", session_id=fid)

    r = run(go())
    assert (r.result, r.steps, r.text) == ("stop", 1, "f is written.")  # (it ended the turn unanswered)
    assert log.count("write") == 1


def test_a_fork_at_a_summary_that_closed_a_finished_turn_has_nothing_to_resume(store):
    from we0nb.testing import usage

    src = We0Agent(ScriptedModel([[text("All done."), usage(input_tokens=900)], [text("Summary: done.")]],
                                 context_window=1000), persistence=store)

    async def go():
        await src.invoke(session_id="ses_fin", messages=[user_message("finish")])
        t = await src.transcript("ses_fin")
        assert t.messages[-1].info.summary  # (a finished turn: no user message again)
        fid = await src.fork("ses_fin", at=t.messages[-1].info.id)
        again = We0Agent(ScriptedModel([]), persistence=store)
        return await again.invoke(mode="resume", session_id=fid)

    r = run(go())
    assert (r.result, r.steps) == ("stop", 0)
