"""Fixes for a tester's probes of the notebook layer: a saved Run All of chained ``%%we0`` cells
keeps every panel's final state; a resumed run's view starts from the stored turn; the magic's
user mistakes are one-line UsageErrors; control and bidi characters are shown, not obeyed; a
resume of an unknown session says so; the recovery footer tells of its own run only."""

from __future__ import annotations

import asyncio
import re
import time

import pytest

from we0nb import MemoryPersistence, ScriptedModel, We0Agent, text, tool, tool_call, user_message

pytest.importorskip("ipywidgets")

from we0nb.notebook import RunPanel  # noqa: E402

#: what must never reach a rendering raw: NUL, ESC, a C1 control, RLO, an isolate
HIDDEN = re.compile("[\x00\x1b\x85\u202e\u2066]")
HOSTILE = "A\x00B \x1b[31mred\x1b[0m \x85 \u202eevil\u202c \u2066iso\u2069 <script>x</script>"


class Handle:
    def __init__(self):
        self.bundles = []

    def update(self, bundle):
        self.bundles.append(bundle)


def collecting():
    handles: list[Handle] = []
    return handles, (lambda b: handles.append(Handle()) or handles[-1])


async def until(pred, timeout=20):
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, "timed out waiting"
        await asyncio.sleep(0.01)


@tool(side_effects=False)
async def look(x: int) -> str:
    await asyncio.sleep(1)
    return "seen"


async def aborted_during_a_tool(p, sid="s"):
    """A run aborted while its read-only tool runs, after streaming 'PARTIAL-TEXT '."""
    a1 = We0Agent(ScriptedModel([[text("PARTIAL-TEXT "), tool_call("look", {"x": 1})]], delay=0.01),
                  tools=[look], persistence=p)
    abort = asyncio.Event()
    asyncio.get_running_loop().call_later(0.5, abort.set)
    with pytest.raises(asyncio.CancelledError):
        await a1.invoke(session_id=sid, messages=[user_message("QUESTION")], abort=abort)


# --------------------------------------------------------------------------- 2. resume views


async def test_show_resume_starts_from_the_stored_turn():
    import we0nb

    p = MemoryPersistence()
    await aborted_during_a_tool(p)
    a2 = We0Agent(ScriptedModel([[text("final")]]), tools=[look], persistence=p)
    h = Handle()
    result = await we0nb.show(a2, mode="resume", session_id="s", handle=h)
    assert result.text == "final"
    plain = h.bundles[-1]["text/plain"]
    assert "[user] QUESTION" in plain
    assert "[assistant] (UnfinishedAssistantMessage) PARTIAL-TEXT" in plain
    assert "tool look" in plain and "[assistant] final" in plain
    assert plain.count("PARTIAL-TEXT") == 1  # updated in place, not shown twice
    assert "QUESTION" in h.bundles[-1]["text/html"] and "PARTIAL-TEXT" in h.bundles[-1]["text/html"]


async def test_a_new_panel_resumes_from_the_stored_turn():
    p = MemoryPersistence()
    await aborted_during_a_tool(p)
    agent = We0Agent(ScriptedModel([[text("final")]]), tools=[look], persistence=p)
    handles, display = collecting()
    panel = RunPanel(agent, session_id="s", display=display)  # (a new kernel on the same store)
    await until(lambda: panel.status == "needs resume")
    assert "PARTIAL-TEXT" in panel.view.text(final=True)  # the turn is taken in before any run
    # the view's badge says what the status line says (it said a grey "idle")
    assert re.search(r"we0-s-unfinished[^>]*>needs resume<", panel.view.html(final=True))
    panel.resume()
    assert (await panel.wait()).text == "final"
    plain = handles[0].bundles[-1]["text/plain"]
    assert "[user] QUESTION" in plain and plain.count("PARTIAL-TEXT") == 1 and "[assistant] final" in plain


# --------------------------------------------------------------------------- 5. wording, footer


async def test_resume_of_an_unknown_session_says_so():
    agent = We0Agent(ScriptedModel([[text("x")]]))
    handles, display = collecting()
    panel = RunPanel(agent, session_id="ses_nowhere", check=False, display=display)
    panel.resume()
    assert await panel.wait() is None
    assert "last turn is over" not in panel.status_text()
    assert "nothing to resume: session ses_nowhere is not in the store" in panel.status_text()
    assert panel.status == "idle" and panel.resume_button.disabled
    assert "is not in the store" in handles[0].bundles[-1]["text/html"]


async def test_the_recovery_footer_tells_of_its_own_run_only():
    p = MemoryPersistence()
    await aborted_during_a_tool(p)
    agent = We0Agent(ScriptedModel([[text("final")], [text("later")]]), tools=[look], persistence=p)
    handles, display = collecting()
    panel = RunPanel(agent, session_id="s", check=False, display=display)
    panel.resume()
    await panel.wait()
    assert "recovery: recall look; closed the unfinished assistant message" in panel.view.text(final=True)
    panel.start("a plain prompt")
    assert (await panel.wait()).text == "later"
    final = handles[0].bundles[-1]
    assert "recovery:" not in final["text/plain"] and "recovery:" not in final["text/html"]


# --------------------------------------------------------------------------- 4. control characters


async def test_control_and_bidi_characters_are_shown_not_obeyed():
    from we0nb.notebook.html import esc, render_html, render_text

    @tool(requires_approval=True)
    def pay(to: str) -> str:
        return "paid"

    agent = We0Agent(ScriptedModel([[text(HOSTILE), tool_call("pay", {"to": HOSTILE})]]), tools=[pay])
    handles, display = collecting()
    panel = RunPanel(agent, session_id="ses_h", display=display)
    panel.start(HOSTILE)
    result = await panel.wait()
    assert result.result == "approval"
    t = await agent.transcript("ses_h")
    rendered = {"live html": handles[0].bundles[-1]["text/html"], "live plain": handles[0].bundles[-1]["text/plain"],
                "status line": panel.status_label.value, "status text": panel.status_text(),
                "widget fallback": panel._widget_bundle()["text/plain"],
                "approval row": panel.approvals.rows[0].info.value,
                "approval args": panel.approvals.rows[0].args.value,
                "esc": esc(HOSTILE)}
    for obj in (t, t.messages[0], t.messages[1], t.messages[1].parts[-1], result):
        rendered[f"{type(obj).__name__} html"] = obj._repr_html_()
        rendered[f"{type(obj).__name__} plain"] = obj._repr_mimebundle_()["text/plain"]
        rendered[f"{type(obj).__name__} render"] = render_html(obj) + render_text(obj)
    for name, out in rendered.items():
        assert not HIDDEN.search(out), (name, out)
    assert "\\x1b[31mred" in rendered["live plain"] and "\\u202eevil" in rendered["live plain"]
    assert "\\x00" in rendered["Transcript html"] and "&lt;script&gt;" in rendered["Transcript html"]
    # the editable arguments stay JSON with the same value: approving them approves what was asked
    import json

    assert json.loads(rendered["approval args"]) == {"to": HOSTILE}


# --------------------------------------------------------------------------- 3. the magic's mistakes


@pytest.fixture
def shell():
    from IPython.core.interactiveshell import InteractiveShell

    from we0nb.notebook.magics import load_ipython_extension

    ip = InteractiveShell.instance()
    load_ipython_extension(ip)
    saved = dict(ip.user_ns)
    yield ip
    ip.user_ns.clear()
    ip.user_ns.update(saved)


@pytest.mark.parametrize("line, cell, needle", [
    ("", "hello", "no variable 'agent'"),                                   # was a NameError traceback
    ("--agent notagent", "hello", "the variable 'notagent' is not a We0Agent (it is int)"),  # was a TypeError
    ("", "   \n", "the cell body is the user message; it is empty"),       # was a ValueError traceback
    ("--resume", None, "no session to resume"),                              # was a ValueError traceback
    ("--resume --new", None, "--resume and --new together"),
    ("-s ''", "hi", "the session id is empty"),                              # was accepted as "''"
    ("--panel 1bad", "hi", "'1bad' is not a Python variable name"),          # was accepted
])
async def test_every_user_mistake_of_the_magic_is_one_usage_error(shell, line, cell, needle):
    from IPython.core.error import UsageError

    if "notagent" not in line and "no variable" not in needle:
        shell.user_ns["agent"] = We0Agent(ScriptedModel([[text("hi")]]))
    shell.user_ns["notagent"] = 42
    magic = shell.find_magic("we0", "cell" if cell is not None else "line")
    with pytest.raises(UsageError, match=re.escape(needle)) as info:
        magic(line, cell) if cell is not None else magic(line)
    assert "\n" not in str(info.value)
    assert "1bad" not in shell.user_ns


async def test_the_magic_reads_quotes_as_a_shell_does(shell):
    shell.user_ns["agent"] = We0Agent(ScriptedModel([[text("hi")]]))
    shell.find_magic("we0", "cell")("--session 'my session'", "hello")
    panel = shell.user_ns["we0_panel"]
    assert panel.session_id == "my session"
    assert (await panel.wait()).text == "hi"


# --------------------------------------------------------------------------- 1. Run All, saved


@pytest.mark.kernel
def test_run_all_of_chained_we0_cells_saves_every_panels_final_state(tmp_path):
    """nbclient drops what a background task sends after its cell ended: each earlier panel's
    final state is re-sent by a later cell (a %%we0 cell that follows it, or the awaiting cell)."""
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("nbclient")
    from nbutil_kernel import execute_notebook

    cells = ["import asyncio\nfrom we0nb import We0Agent, ScriptedModel, text\n"
             "agent = We0Agent(ScriptedModel([[text(['tok '] * 50)]] * 3, delay=0.005))",
             "%load_ext we0nb",
             "%%we0 --session ses_a\nfirst",
             "await asyncio.sleep(1.5)",            # the first run ends after its cell did
             "%%we0 --session ses_b\nsecond",       # re-sends the first panel's final state
             "%%we0\nthird",                        # queued behind the second
             "r = await we0_panel.wait(); r.text[:8]"]
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    execute_notebook(nb, tmp_path)
    for i in (2, 4, 5):
        outs = nb.cells[i].outputs
        fallback = [o["data"]["text/plain"] for o in outs if "application/vnd.jupyter.widget-view+json"
                    in o.get("data", {})]
        assert fallback and fallback[0].startswith("status: finished"), (i, fallback)
        views = [o["data"] for o in outs if "we0-live" in o.get("data", {}).get("text/html", "")]
        assert views and views[0]["text/plain"].startswith("we0nb run [finished]"), (i, views)
        assert "data-status='finished'" in views[0]["text/html"] and "tok tok" in views[0]["text/plain"]
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    statuses = [m["state"]["value"] for m in state.values() if "we0-status" in m["state"].get("_dom_classes", [])]
    aborts = [m["state"]["disabled"] for m in state.values() if "we0-abort" in m["state"].get("_dom_classes", [])]
    assert len(statuses) == 3 and all("status: finished" in s for s in statuses), statuses
    assert aborts == [True, True, True]
