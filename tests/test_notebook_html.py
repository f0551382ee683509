"""Display hooks: every public object has a safe text/html and a readable text/plain."""

import asyncio
import sys

import pytest
from enginekit import hanging_read

from we0nb import (
    ScriptedModel,
    We0Agent,
    text,
    tool,
    tool_call,
    user_message,
)
from we0nb.notebook.html import esc, render_html, render_text
from we0nb.testing import reasoning

XSS = '<img src=x onerror="window.__pwned=1">'


@tool(side_effects=False)
def lookup(q: str) -> str:
    return f"<b>{q}</b>"


@tool
def explode(q: str) -> str:
    raise RuntimeError(f"<script>alert('{q}')</script>")


def _agent():
    model = ScriptedModel([
        [reasoning(XSS), text("Checking " + XSS), tool_call("lookup", {"q": XSS}), tool_call("explode", {"q": XSS})],
        [text(XSS + " final")],
    ])
    return We0Agent(model, tools=[lookup, explode])


async def _run(agent, sid="ses_html"):
    result = await agent.invoke(session_id=sid, messages=[user_message(XSS)])
    return result, await agent.transcript(sid)


def _all_objects(result, transcript, agent):
    objs = [result, transcript, transcript.session, agent.build_request(messages=[user_message(XSS)])]
    for m in transcript.messages:
        objs += [m, m.info, *m.parts]
    return objs


def test_escape_basics():
    assert esc(XSS) == "&lt;img src=x onerror=&quot;window.__pwned=1&quot;&gt;"
    assert esc(None) == ""
    assert esc("a'b") == "a&#x27;b"


async def test_every_object_has_safe_html_and_plain():
    agent = _agent()
    result, transcript = await _run(agent)
    kinds = set()
    for obj in _all_objects(result, transcript, agent):
        bundle = obj._repr_mimebundle_()
        assert set(bundle) >= {"text/html", "text/plain"}, type(obj)
        assert obj._repr_html_() == bundle["text/html"]
        html = bundle["text/html"]
        assert "<img" not in html and "<script" not in html, type(obj).__name__
        assert "onerror=\"" not in html
        assert bundle["text/plain"].strip(), type(obj).__name__
        assert "<style>" in html and "var(--jp-" in html
        kinds.add(type(obj).__name__)
    assert kinds >= {"RunResult", "RunRequest", "Transcript", "Session", "UserMessage", "AssistantMessage",
                     "MessageWithParts", "TextPart", "ReasoningPart", "ToolPart", "StepStartPart", "StepFinishPart"}


async def test_transcript_reads_like_a_chat():
    agent = _agent()
    _, transcript = await _run(agent)
    html = transcript._repr_html_()
    # user and assistant turns, collapsible reasoning, a tool table with coloured statuses
    assert html.count("we0-turn we0-user") == 1
    assert html.count("we0-turn we0-assistant") == 2
    assert "<details class='we0-reasoning'" in html
    assert "<table class='we0-tools' style=" in html  # inline styles: readable when sanitised
    assert "we0-s-completed" in html and "we0-s-error" in html
    assert esc("<b>" + XSS + "</b>") in html  # the tool output, escaped
    assert "RuntimeError" in html
    plain = transcript._repr_mimebundle_()["text/plain"]
    assert plain.splitlines()[0] == f"Transcript ses_html {XSS!r}: 3 messages"
    assert "tool lookup(" in plain and "completed" in plain and "tool explode(" in plain and " error " in plain
    assert plain.rstrip().endswith(XSS + " final")


async def test_interrupted_and_recalled_tools_are_labelled():
    slow_read, started = hanging_read("<i>{path}</i>")  # hangs until the abort; the recall returns at once

    @tool
    def send(to: str) -> str:
        return "sent"

    model = ScriptedModel([[tool_call("send", {"to": "x"}), tool_call("slow_read", {"path": "a"}),
                            tool_call("send", {"to": "b"})],
                           [text("done")]])
    agent = We0Agent(model, tools=[slow_read, send])
    abort = asyncio.Event()
    task = asyncio.create_task(agent.invoke(abort=abort, session_id="ses_int", messages=[user_message("go")]))
    await asyncio.wait_for(started.wait(), 10)
    abort.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    unfinished = await agent.transcript("ses_int")
    assert "we0-s-unfinished" in unfinished._repr_html_()
    assert "[assistant] (unfinished)" in unfinished._repr_mimebundle_()["text/plain"]
    assert " running" in unfinished._repr_mimebundle_()["text/plain"]

    await agent.invoke(mode="resume", session_id="ses_int")
    t = await agent.transcript("ses_int")
    html = t._repr_html_()
    plain = t._repr_mimebundle_()["text/plain"]
    assert "we0-s-interrupted" in html and "interrupted (resume)" in html
    assert "recalled" in html and "&lt;i&gt;a&lt;/i&gt;" in html
    assert "UnfinishedAssistantMessage" in html
    # said in words, not as an error class: "UnfinishedAssistantMessage: Assistant message was not…"
    assert "This reply was cut before it finished (an abort or a crash); the resume closed it." in html
    assert "UnfinishedAssistantMessage:" not in html
    assert "tool slow_read({\"path\": \"a\"}) completed [recalled]" in plain
    assert "tool send({\"to\": \"b\"}) interrupted (resume)" in plain


def test_missing_session_and_plain_objects():
    from we0nb import Transcript

    t = Transcript()
    assert "no such session" in t._repr_html_()
    assert t._repr_mimebundle_()["text/plain"] == "Transcript(no session)"
    assert render_text(object()).startswith("<object object")
    assert "&lt;object" in render_html(object())


def test_long_tool_output_is_clipped_in_html_but_kept():
    from we0nb.messages import ToolPart, ToolStateCompleted, ToolTime

    big = "x" * 5000 + "<end>"
    p = ToolPart(id="prt_1", session_id="s", message_id="m", call_id="c", tool="t",
                 state=ToolStateCompleted(input={}, output=big, time=ToolTime(start=1.0, end=2.5)))
    html = p._repr_html_()
    assert "more characters" in html and "&lt;end&gt;" in html and "1.50 s" in html


def test_html_module_imports_no_ipython():
    import subprocess

    code = ("import sys, we0nb, we0nb.notebook, we0nb.notebook.html, we0nb.notebook.live; "
            "from we0nb import Transcript; Transcript()._repr_html_(); "
            "bad = [m for m in ('IPython', 'ipywidgets', 'pandas') if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_data_model_display_comes_through_the_registry(monkeypatch):
    """The data model renders by the hook ``import we0nb`` connects, not by importing the notebook."""
    import we0nb._plugins as plugins
    from we0nb.messages import Session

    s = Session(id="ses_1", title="t", time={"created": 1.0, "updated": 1.0})
    assert "we0-head" in s._repr_mimebundle_()["text/html"]
    monkeypatch.setattr(plugins, "_DISPLAY", None)
    assert s._repr_mimebundle_() == {"text/plain": repr(s)} and s._repr_html_() is None
