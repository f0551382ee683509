"""Cassette: record once against a "real" model, replay afterwards without it (vcrpy's modes)."""

from __future__ import annotations

import asyncio

import pytest

from enginekit import Log, make_tools
from we0nb import ReplayMismatchError, ScriptedModel, We0Agent, text, tool_call, user_message
from we0nb.engine.cassette import Cassette


def _real():
    return ScriptedModel([[tool_call("write", {"path": "f"})], [text("written")]], model_id="real-model")


async def _run(cassette: Cassette, log: Log, prompt: str = "write f", real=_real):
    agent = We0Agent(cassette.model(real), tools=cassette.tools(make_tools(log)), persistence=cassette.persistence)
    try:
        return await agent.invoke(session_id=cassette.session_id, messages=[user_message(prompt)])
    finally:
        await cassette.close()


def test_once_records_then_replays_without_model_or_side_effects(tmp_path):
    path = tmp_path / "cassettes" / "case.db"
    log = Log()
    first = Cassette(path, "ses_case")
    assert first.recording
    assert asyncio.run(_run(first, log)).text == "written" and log.count("write") == 1

    made = []
    second = Cassette(path, "ses_case")
    assert not second.recording
    result = asyncio.run(_run(second, log, real=lambda: made.append(1) or _real()))
    assert result.text == "written" and made == [] and log.count("write") == 1  # no model, no tool ran

    with pytest.raises(ReplayMismatchError, match="step 1"):
        asyncio.run(_run(Cassette(path, "ses_case"), log, prompt="write g"))


def test_none_refuses_to_record_and_all_records_again(tmp_path):
    path = tmp_path / "c.db"
    with pytest.raises(ValueError, match="mode='none' never records"):
        Cassette(path, "ses_x", mode="none")
    assert not path.exists()
    log = Log()
    asyncio.run(_run(Cassette(path, "ses_x"), log))
    again = Cassette(path, "ses_x", mode="all")
    assert again.recording
    asyncio.run(_run(again, log))
    assert log.count("write") == 2
    with pytest.raises(ValueError, match="record modes"):
        Cassette(path, "ses_x", mode="new_episodes")


def test_a_recording_that_compacted_replays_with_the_real_models_context_window(tmp_path):
    from we0nb.testing import usage

    path = tmp_path / "compacting.db"

    def real():
        return ScriptedModel([[text("A long answer."), usage(input_tokens=900)], [text("Summary: answered.")]],
                             context_window=1000)

    async def run(cassette: Cassette):
        agent = We0Agent(cassette.model(real), persistence=cassette.persistence)
        try:
            return await agent.invoke(session_id=cassette.session_id, messages=[user_message("go")])
        finally:
            await cassette.close()

    assert asyncio.run(run(Cassette(path, "ses_long"))).result == "compact"
    replayed = asyncio.run(run(Cassette(path, "ses_long", context_window=1000)))
    assert (replayed.result, replayed.text) == ("compact", "A long answer.")
