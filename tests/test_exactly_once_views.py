"""SPEC §11 where a person reads it: every surface says whether an interrupted call may have run
or never started, and which call was completed on resume — words read off the stored metadata."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from we0nb import MemoryPersistence, Reconciled, ScriptedModel, SqlPersistence, We0Agent, text, tool
from we0nb.messages import COMPLETED_ON_RESUME, MAY_HAVE_RUN, NEVER_STARTED, ToolPart

from enginekit import seed, state

SID = "ses_views"


def _agent(p: Any) -> We0Agent:
    def charge(amount: int) -> str:
        return f"charged {amount}"

    tools = [tool(charge, name="pay_checked", reconcile=lambda ctx, inp: Reconciled.done("charged before")),
             tool(charge, name="pay")]
    return We0Agent(ScriptedModel([[text("ok")]]), tools=tools, persistence=p)


async def _seeded(p: Any) -> We0Agent:
    """A crash left three calls: one its reconcile finds done, one running, one never started."""
    await seed(p, SID, [("pay_checked", state("running", amount=1)), ("pay", state("running", amount=2)),
                        ("pay", state("pending", amount=3))])
    return _agent(p)


async def _resumed(p: Any) -> list[ToolPart]:
    agent = await _seeded(p)
    await agent.invoke(mode="resume", session_id=SID)
    t = await agent.transcript(SID)
    return [x for m in t.messages for x in m.tool_parts]


async def test_the_words_come_from_the_stored_metadata() -> None:
    parts = await _resumed(MemoryPersistence())
    assert [p.effect for p in parts] == [COMPLETED_ON_RESUME, MAY_HAVE_RUN, NEVER_STARTED]
    assert [p.state.metadata.get("in_doubt") for p in parts] == [None, True, False]
    # the same call without the stored flag says nothing (no word is guessed)
    bare = parts[1].model_copy(update={"state": parts[1].state.model_copy(update={"metadata": {
        "interrupted": True, "reason": "resume"}})})
    assert bare.in_doubt is None and bare.effect is None


async def test_html_transcript_badges() -> None:
    from we0nb.notebook.html import render_html, tool_table_html

    p = MemoryPersistence()
    parts = await _resumed(p)
    rows = tool_table_html(parts)
    assert "<span class='we0-badge we0-o-reconciled'>completed on resume</span>" in rows
    assert "<span class='we0-badge we0-o-in_doubt'>may have run</span>" in rows
    assert "<span class='we0-badge we0-o-never_started'>never started</span>" in rows
    page = render_html(await _agent(p).transcript(SID))
    assert page.count("may have run</span>") == 1 and "never started</span>" in page
    assert "background-color:#c62828" in page  # (an inline style: it survives an untrusted notebook)


async def test_plain_text_of_a_call() -> None:
    from we0nb.notebook.plain import render_text

    parts = await _resumed(MemoryPersistence())
    assert "[completed on resume]" in render_text(parts[0])
    assert "interrupted (resume) [may have run]" in render_text(parts[1])
    assert "[never started]" in render_text(parts[2])


async def test_live_view_of_a_resume_shows_the_badges() -> None:
    from we0nb.notebook.live import LiveView

    class Handle:
        def __init__(self) -> None:
            self.bundles: list[dict] = []

        def update(self, bundle: dict) -> None:
            self.bundles.append(bundle)

    agent = await _seeded(MemoryPersistence())
    handle = Handle()
    view = LiveView(handle=handle, interval=0.05)
    view.start()
    await view.consume(agent.stream(mode="resume", session_id=SID))
    final = handle.bundles[-1]
    for words in (MAY_HAVE_RUN, NEVER_STARTED, COMPLETED_ON_RESUME):
        assert f">{words}</span>" in final["text/html"], words
        assert f"[{words}]" in final["text/plain"], words


async def test_panel_status_says_what_the_resume_found() -> None:
    pytest.importorskip("ipywidgets")
    from we0nb.notebook import RunPanel

    agent = await _seeded(MemoryPersistence())
    panel = RunPanel(agent, session_id=SID, display=lambda b: None, check=False)
    panel.resume()
    await asyncio.wait_for(panel.wait(), 20)
    assert panel.status == "finished"
    assert "1 call completed on resume · 1 call may have run · 1 call never started" in panel.status_text()


def test_cli_show_says_may_have_run_and_never_started(tmp_path: Any, capsys: Any) -> None:
    from we0nb.cli import main

    url = f"sqlite:///{tmp_path / 'v.db'}"

    async def go() -> None:
        p = SqlPersistence(url)
        try:
            await _resumed(p)
        finally:
            await p.close()

    asyncio.run(go())
    assert main(["show", SID, "--db", url]) == 0
    out = capsys.readouterr().out
    assert "reconciled: completed on resume" in out
    assert "interrupt (resume): may have run" in out and "interrupt (resume): never started" in out


async def test_plot_legend_names_the_outcomes_in_the_same_words() -> None:
    pytest.importorskip("matplotlib")
    from we0nb.notebook.plots import plot_tools

    p = MemoryPersistence()
    await _resumed(p)
    fig = await asyncio.to_thread(plot_tools, p)
    labels = [t.get_text() for t in fig.axes[1].get_legend().get_texts()]
    assert "completed on resume" in labels and "interrupted: may have run" in labels
    assert "interrupted: never started" in labels
