"""RunPanel without a kernel: background task, Abort from another thread, Resume, statuses."""

import asyncio
import time

import pytest

from we0nb import ScriptedModel, We0Agent, text
from we0nb.notebook import RunPanel
from widgetkit import click_from_thread, until

pytest.importorskip("ipywidgets")


class Handle:
    def __init__(self):
        self.bundles = []

    def update(self, bundle):
        self.bundles.append(bundle)


def _agent(n=3000, delay=0.002):
    return We0Agent(ScriptedModel([[text([f"w{i} " for i in range(n)])], [text("Resumed and finished.")]],
                                  delay=delay))


async def test_abort_from_another_thread_then_resume():
    handles = []
    agent = _agent()
    panel = RunPanel(agent, session_id="ses_panel", display=lambda b: handles.append(Handle()) or handles[-1])
    assert panel.status == "idle" and panel.abort_button.disabled and panel.resume_button.disabled
    panel.start("hello")
    assert panel.status == "running"
    assert not panel.abort_button.disabled and panel.resume_button.disabled
    await until(lambda: panel.view.delta_count > 20)
    click_from_thread(panel.abort_button)
    assert await asyncio.wait_for(panel.wait(), 10) is None
    assert panel.status == "aborted"
    assert panel.click_threads == ["subshell-fake"]
    assert panel.last_abort_latency is not None and panel.last_abort_latency < 0.5
    assert panel.abort_button.disabled and not panel.resume_button.disabled
    assert "status: aborted" in panel.status_label.value
    t = await agent.transcript("ses_panel")
    last = t.messages[-1]
    assert last.info.role == "assistant" and last.info.time.completed is None and last.text.startswith("w0 w1 ")

    click_from_thread(panel.resume_button)
    await until(lambda: panel.status != "aborted")
    result = await asyncio.wait_for(panel.wait(), 20)
    assert result.text == "Resumed and finished."
    assert panel.status == "finished"
    assert panel.resume_button.disabled and panel.abort_button.disabled
    t = await agent.transcript("ses_panel")
    assert t.messages[-2].info.error.reason == "UnfinishedAssistantMessage"
    html = handles[0].bundles[-1]["text/html"]
    assert len(handles) == 1  # one display for both runs
    assert "Resumed and finished." in html and "w0 w1 " in html and "UnfinishedAssistantMessage" in html


async def test_failure_shows_in_the_panel_and_wait_reraises():
    agent = We0Agent(ScriptedModel([[text("only one step")]]))
    panel = RunPanel(agent, display=lambda b: Handle())
    panel.start("one")
    assert (await panel.wait()).text == "only one step"
    assert panel.status == "finished" and panel.session_id.startswith("ses_")
    panel.start("two")  # the script is exhausted: the run fails
    with pytest.raises(Exception, match="ScriptedModel was called 2 times"):
        await panel.wait()
    assert panel.status == "failed" and "ScriptExhaustedError" in panel.status_label.value
    assert not panel.resume_button.disabled


async def test_busy_and_needs_resume():
    agent = _agent(n=2000, delay=0.002)
    panel = RunPanel(agent, session_id="ses_nr", display=lambda b: Handle())
    panel.start("x")
    with pytest.raises(RuntimeError, match="already going on"):
        panel.start("y")
    await until(lambda: panel.view.delta_count > 5)
    panel.abort()
    await panel.wait()
    # a new panel on the same session sees the unfinished turn
    other = RunPanel(agent, session_id="ses_nr", display=lambda b: Handle())
    await until(lambda: other.status == "needs resume")
    assert not other.resume_button.disabled
    other.resume()
    assert (await other.wait()).text == "Resumed and finished."
    assert other.status == "finished"


def test_panel_needs_a_loop():
    panel = RunPanel(_agent(), display=lambda b: Handle())
    with pytest.raises(RuntimeError, match="event loop"):
        panel.start("x")
    with pytest.raises(TypeError):
        RunPanel(object())


async def test_panels_on_one_session_queue_and_the_older_one_is_superseded():
    agent = _agent(n=400, delay=0.002)
    first = RunPanel(agent, session_id="ses_q", display=lambda b: Handle())
    first.start("one")
    second = RunPanel(agent, session_id="ses_q", display=lambda b: Handle())
    second.start("two")  # does not fail with SessionBusyError: it waits for the first run
    assert "queued" in second.status_label.value
    assert (await first.wait()).text.startswith("w0 w1")
    result = await second.wait()
    assert result.text == "Resumed and finished."
    t = await agent.transcript("ses_q")
    assert [m.info.role for m in t.messages] == ["user", "assistant", "user", "assistant"]
    # the older panel's Resume would act on a stale view: disabled, and the status says why
    assert first.resume_button.disabled and "a newer panel runs this session" in first.status_label.value


async def test_resume_reads_the_store_first_and_the_delta_count_is_per_run():
    agent = _agent(n=2000, delay=0.002)
    panel = RunPanel(agent, session_id="ses_r", display=lambda b: Handle())
    panel.start("x")
    await until(lambda: panel.view.delta_count > 20)
    panel.abort()
    await panel.wait()
    prompt_deltas = panel.view.delta_count
    assert prompt_deltas > 20
    # after the abort the view shows the store: the unfinished message, its partial text persisted
    html = panel.view.bundle(final=True)["text/html"]
    assert "we0-s-unfinished" in html and "calls cut at the abort stay as they were stored" in html
    panel.resume()
    assert (await panel.wait()).text == "Resumed and finished."
    assert panel.view.delta_count == 3  # "Resumed and finished." streams as 3 words: this run's count only
    # a resume of a session whose turn is over runs nothing, says so, and keeps the table as stored
    panel.resume()
    assert await panel.wait() is None
    assert panel.status == "finished" and "nothing to resume" in panel.status_label.value
    t = await agent.transcript("ses_r")
    assert len(t.messages) == 3


async def test_a_long_error_wraps_instead_of_squeezing_the_buttons():
    agent = We0Agent(ScriptedModel([[text("only one step")]]))
    panel = RunPanel(agent, display=lambda b: Handle())
    panel.start("one")
    await panel.wait()
    panel.start("two")
    with pytest.raises(Exception):
        await panel.wait()
    assert panel.status == "failed"
    assert panel.abort_button.layout.flex == "0 0 auto" and panel.resume_button.layout.flex == "0 0 auto"
    assert panel.status_label.layout.min_width == "0" and "white-space:normal" in panel.status_label.value
    assert ".." not in panel.status_label.value.replace("...", "")


async def test_a_wrapped_model_error_reads_without_a_double_period():
    from we0nb import FunctionModel

    def boom(request):
        raise RuntimeError("the server went away.")

    panel = RunPanel(We0Agent(FunctionModel(boom)), display=lambda b: Handle())
    panel.start("hi")
    with pytest.raises(Exception, match="went away. The partial output is persisted"):
        await panel.wait()
    assert "away.. " not in panel.status_label.value and "went away. The partial" in panel.status_label.value
