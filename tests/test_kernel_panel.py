"""Real kernel: the run panel's Abort/Resume buttons clicked with real comm messages.

The click is the message JupyterLab sends (``comm_msg`` with ``{"method": "custom",
"content": {"event": "click"}}`` on the button's comm id), on the main shell and on a
kernel subshell (JupyterLab 4.6 sends widget messages to a subshell by default).
"""

import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("jupyter_client")

from nbutil_kernel import Kernel, execute_notebook  # noqa: E402

pytestmark = pytest.mark.kernel

SETUP = """
import asyncio, threading, we0nb
from we0nb import We0Agent, ScriptedModel, text, tool, tool_call
from we0nb.notebook import RunPanel

@tool(side_effects=False)
def lookup(q: str) -> str:
    return "found " + q

agent = We0Agent(ScriptedModel([
    [text("Looking it up."), tool_call("lookup", {"q": "abc"})],
    [text([f"w{i} " for i in range(20000)])],
    [text("Resumed and finished.")],
], delay=0.004), tools=[lookup])
panel = RunPanel(agent, session_id="ses_k")
panel.start("hello")
print(panel.abort_button.model_id, panel.resume_button.model_id)
"""


@pytest.fixture
def kernel(tmp_path):
    k = Kernel(cwd=str(tmp_path))
    try:
        yield k
    finally:
        k.shutdown()


def _abort_and_resume(k: Kernel, subshell_id=None):
    abort_id, resume_id = k.run(SETUP)["stdout"].split()
    assert k.eval("panel.status") == "running"
    k.wait_for("panel.view.delta_count > 50", 120, "text to stream after the tool step")
    assert k.eval("panel.abort_button.disabled") is False
    k.click(abort_id, subshell_id)
    k.wait_for("panel.status == 'aborted'", 60, "the aborted status")
    latency = k.eval("panel.last_abort_latency")
    assert latency is not None and latency < 0.5, latency
    threads = k.eval("panel.click_threads")
    assert len(threads) == 1
    # the state is persisted: the streaming message is unfinished, with its partial text
    k.run("t = await agent.transcript('ses_k'); last = t.messages[-1]")
    assert k.eval("last.info.role") == "assistant"
    assert k.eval("last.info.time.completed is None") is True
    assert k.eval("last.text.startswith('w0 w1 w2 ')") is True
    assert k.eval("len(last.text) < len(''.join(f'w{i} ' for i in range(20000)))") is True
    assert k.eval("[m.info.role for m in t.messages]") == ["user", "assistant", "assistant"]
    assert k.eval("panel.resume_button.disabled") is False

    k.click(resume_id, subshell_id)
    k.wait_for("panel.status == 'finished'", 60, "the finished status")
    k.run("r = await panel.wait(); t = await agent.transcript('ses_k')")
    assert k.eval("r.text") == "Resumed and finished."
    assert k.eval("t.messages[-2].info.error.reason") == "UnfinishedAssistantMessage"
    assert k.eval("t.messages[1].tool_parts[0].state.status") == "completed"
    assert k.eval("panel.abort_button.disabled and panel.resume_button.disabled") is True
    # one display for the whole panel, updated in place: its final bundle holds both runs
    final = k.eval("panel.view.bundle(final=True)['text/html']")
    assert "Resumed and finished." in final and "UnfinishedAssistantMessage" in final
    return threads


def test_abort_and_resume_with_real_clicks(kernel):
    threads = _abort_and_resume(kernel)
    # the live view went out as one display_data plus coalesced update_display_data messages
    disp = kernel.display_messages()
    ids = {m["content"].get("transient", {}).get("display_id") for m in disp
           if m["msg_type"] == "update_display_data" and "we0-live" in m["content"]["data"].get("text/html", "")}
    assert len(ids) == 1  # (the widgets' display is updated too, once the run ended: see test_saved_state)
    print("click handled on", threads)


def test_abort_and_resume_clicked_on_a_kernel_subshell(kernel):
    if not kernel.supports_subshells:
        pytest.skip(f"ipykernel {kernel.info.get('implementation_version')} has no kernel subshells")
    sid = kernel.create_subshell()
    threads = _abort_and_resume(kernel, subshell_id=sid)
    print("click handled on", threads)


def test_cell_magic_runs_the_panel(kernel):
    kernel.run("from we0nb import We0Agent, ScriptedModel, text\n"
               "agent = We0Agent(ScriptedModel([[text('first <reply>')], [text('second reply')]]))\n"
               "%load_ext we0nb")
    r = kernel.run("%%we0 --session ses_magic\nHello <there>\nsecond line")
    # the panel's widget and the live view's display went out in the cell
    types = [m["msg_type"] for m in r["msgs"]]
    assert "display_data" in types
    bundles = [m["content"]["data"] for m in r["msgs"] if m["msg_type"] == "display_data"]
    assert any("application/vnd.jupyter.widget-view+json" in b for b in bundles)
    assert any("text/html" in b and "we0-live" in b["text/html"] for b in bundles)
    kernel.run("res = await we0_panel.wait()")
    assert kernel.eval("res.text") == "first <reply>"
    assert kernel.eval("we0_panel.status") == "finished"
    # without --session the next %%we0 continues the same session
    kernel.run("%%we0\nand again")
    kernel.run("res2 = await we0_panel.wait(); t = await agent.transcript('ses_magic')")
    assert kernel.eval("res2.session_id") == "ses_magic"
    assert kernel.eval("[m.text for m in t.messages]") == [
        "Hello <there>\nsecond line", "first <reply>", "and again", "second reply"]
    # resume of a finished session: nothing to do, finishes at once
    kernel.run("%we0 --resume --session ses_magic")
    kernel.run("await we0_panel.wait()")
    assert kernel.eval("we0_panel.status") == "finished"
    r = kernel.result(kernel.submit("%%we0 --agent nope\nhi"))
    assert r["reply"]["status"] == "error" and "no variable 'nope'" in r["reply"]["evalue"]


def test_abort_handler_on_a_foreign_thread_in_a_real_kernel(kernel):
    """What ipykernel 7.0–7.3 does with JupyterLab's subshell comms: the handler runs on
    another thread, where a bare ``asyncio.Event.set()`` would not wake the kernel's loop."""
    kernel.run(SETUP)
    kernel.wait_for("panel.view.delta_count > 50", 120, "text to stream")
    kernel.run("_t = threading.Thread(target=panel.abort_button.click, name='subshell-sim'); _t.start()")
    kernel.wait_for("panel.status == 'aborted'", 60, "the aborted status")
    assert kernel.eval("panel.click_threads") == ["subshell-sim"]
    latency = kernel.eval("panel.last_abort_latency")
    assert latency < 0.5, latency
    kernel.run("_t = threading.Thread(target=panel.resume_button.click, name='subshell-sim'); _t.start()")
    kernel.wait_for("panel.status == 'finished'", 60, "the finished status")
    assert kernel.eval("panel.result.text") == "Resumed and finished."


@pytest.mark.parametrize("channel", ["shell", "subshell"])
def test_abort_while_the_next_cell_awaits_the_panel(kernel, channel):
    """Run All: the cell after the panel awaits ``panel.wait()`` (the main shell is busy);
    the Abort click still stops the run at once and that cell returns."""
    subshell_id = None
    if channel == "subshell":
        if not kernel.supports_subshells:
            pytest.skip(f"ipykernel {kernel.info.get('implementation_version')} has no kernel subshells")
        subshell_id = kernel.create_subshell()
    setup = kernel.submit(SETUP)
    waiting = kernel.submit("r = await panel.wait()\nprint('joined', panel.status, r)")
    abort_id, _ = kernel.result(setup)["stdout"].split()
    # wait for streamed text on the iopub side: the main shell is busy with the await
    deadline = __import__("time").monotonic() + 120
    while not any(m["msg_type"] == "update_display_data" and "w50 " in m["content"]["data"].get("text/html", "")
                  for m in kernel.iopub):
        assert __import__("time").monotonic() < deadline, "no streamed text"
        kernel._pump(0.05)
    kernel.click(abort_id, subshell_id)
    r = kernel.result(waiting, timeout=60)
    assert r["reply"]["status"] == "ok"
    assert r["stdout"].strip() == "joined aborted None"
    assert kernel.eval("panel.last_abort_latency") < 0.5


def test_saved_notebook_shows_how_the_run_ended(tmp_path):
    """Executed and saved by nbclient (as the tutorials are): the widget state and the widgets'
    plain-text fallback say "finished", Abort is disabled — not the state at the cell's end."""
    nbformat = pytest.importorskip("nbformat")

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(
        "from we0nb import We0Agent, ScriptedModel, text\nfrom we0nb.notebook import RunPanel\n"
        "panel = RunPanel(We0Agent(ScriptedModel([[text(['w '] * 100)]], delay=0.01)), session_id='ses_saved')\n"
        "panel.start('hi')"),
        nbformat.v4.new_code_cell("r = await panel.wait()")]
    execute_notebook(nb, tmp_path)
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    by_class = {}
    for model in state.values():
        for cls in model["state"].get("_dom_classes", []):
            by_class[cls] = model["state"]
    assert "status: finished" in by_class["we0-status"]["value"]
    assert by_class["we0-abort"]["disabled"] is True and by_class["we0-resume"]["disabled"] is True
    plain = [o["data"]["text/plain"] for o in nb.cells[0].outputs if "application/vnd.jupyter.widget-view+json"
             in o.get("data", {})]
    assert plain and plain[0].startswith("status: finished · session ses_saved"), plain
    html = [o["data"]["text/html"] for o in nb.cells[0].outputs if "we0-live" in o.get("data", {}).get("text/html", "")]
    assert html and "data-status='finished'" in html[0]


def test_two_we0_cells_in_a_row_queue_and_we0_h_prints_usage(kernel):
    kernel.run("from we0nb import We0Agent, ScriptedModel, text\n"
               "agent = We0Agent(ScriptedModel([[text(['a '] * 200)], [text('second reply')]], delay=0.005))\n"
               "%load_ext we0nb")
    # Run All: both cells are sent at once; the second waits for the first instead of failing
    first = kernel.submit("%%we0 --session ses_two\nfirst")
    second = kernel.submit("%%we0\nsecond")
    joined = kernel.submit("r = await we0_panel.wait(); t = await agent.transcript('ses_two')")
    for msg_id in (first, second, joined):
        assert kernel.result(msg_id)["reply"]["status"] == "ok"
    assert kernel.eval("[m.text for m in t.messages]") == ["first", "a " * 200, "second", "second reply"]
    out = kernel.run("%we0 -h")["stdout"]
    assert "--session" in out and "--resume" in out and "waits for it" in out
