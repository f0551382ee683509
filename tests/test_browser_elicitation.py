"""Real browser: JupyterLab + chromium (Playwright) run a notebook whose MCP server (the SDK test
server, tests/mcp_servers/app.py) asks the user a question while its tool runs
(``elicitation="ask"``). The panel shows the form built from the requested schema — the default
filled in, the server's text escaped — a person clicks Accept with the required field empty (the
row says why; nothing is sent), then fills it in and accepts, while the next cell waits for the
run. The server gets the answer, the run finishes, and the question is kept with the call.

Screenshots go to ``$WE0NB_ARTIFACTS`` (default ``test-artifacts/``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nbutil_lab import lab_page, open_notebook, playwright_or_skip, run_all_until, write_notebook

pytestmark = pytest.mark.browser

APP = Path(__file__).resolve().parent / "mcp_servers" / "app.py"


def _cells(ledger: Path) -> list[str]:
    return [
        f"""import sys
from we0nb import We0Agent, ScriptedModel, text, tool_call
from we0nb.mcp import MCPServer
from we0nb.notebook import RunPanel

server = MCPServer.stdio(sys.executable, [{str(APP)!r}, "--ledger", {str(ledger)!r}], name="test",
                         elicitation="ask")
agent = We0Agent(ScriptedModel([[tool_call("ask", {{"question": "What shall I order? <img src=x onerror='window.__pwned=1'>"}})],
                                [text("Ordered.")]]), tools=[server])
panel = RunPanel(agent, session_id="ses_browser_ask", title="elicitation")
panel.start("Order something")""",
        "r = await panel.wait()",
        "t = await agent.transcript('ses_browser_ask')\n"
        "q = t.messages[1].tool_parts[0].state.metadata['questions'][-1]\n"
        "print('result:', r.result, '|', r.text, '| answer:', q['status'], q['content'], 'by', q['by'], '|',\n"
        "      open(" + repr(str(ledger)) + ").read().strip())\n"
        "await agent.aclose()",
    ]


def _answer(page, artifacts: Path) -> str:
    row = page.locator(".we0-question").first
    text = row.inner_text()
    assert "What shall I order? <img src=x" in text and "MCP server 'test' asks" in text  # shown as text
    assert row.locator(".we0-field-count input").input_value() == "3"  # the schema's default
    assert row.locator(".we0-field-name input").input_value() == ""
    # the live view's row says the call asks a person
    page.wait_for_function("""() => [...document.querySelectorAll('.we0-live')].some(e =>
        e.innerText.includes('asks a person: What shall I order?'))""", timeout=60_000)

    # Accept with the required name empty: the row says why; nothing is sent
    row.locator("button.we0-question-accept").click()
    row.locator(".we0-question-message:has-text(\"'name' is a required property\")").wait_for(timeout=60_000)
    assert "nothing was sent or recorded" in row.locator(".we0-question-message").inner_text().lower()
    page.wait_for_selector(".we0-question button.we0-question-accept:not([disabled])", timeout=60_000)
    cell = page.locator(".jp-Notebook .jp-CodeCell").nth(0)
    cell.scroll_into_view_if_needed()
    cell.locator(".jp-Cell-outputWrapper").screenshot(path=str(artifacts / "elicitation.png"))

    # fill it in (each box sends its value when it loses focus), then Accept
    row.locator(".we0-field-name input").fill("tea")
    row.locator(".we0-field-name input").press("Tab")
    row.locator(".we0-field-count input").fill("2")
    row.locator(".we0-field-count input").press("Tab")
    row.locator("button.we0-question-accept").click()
    out = page.wait_for_function("""() => {
        if (document.querySelector('.jp-Dialog')) return '<dialog>';
        const scroller = document.querySelector('.jp-NotebookPanel .jp-WindowedPanel-outer');
        if (scroller) scroller.scrollTop = scroller.scrollHeight;
        const hit = [...document.querySelectorAll('.jp-OutputArea-output')].find(e => e.innerText.includes('result:'));
        return hit ? hit.innerText : false;
    }""", timeout=180_000).json_value()
    assert page.evaluate("() => window.__pwned") is None
    cell.scroll_into_view_if_needed()
    cell.locator(".jp-Cell-outputWrapper").screenshot(path=str(artifacts / "elicitation-answered.png"))
    return out


@pytest.mark.timeout(1800)  # with the wait for the browser slot
def test_an_elicitation_form_answered_in_jupyterlab(tmp_path, artifacts):
    playwright_or_skip()
    pytest.importorskip("mcp", reason="needs the mcp extra")
    root = tmp_path / "root"
    root.mkdir()
    ledger = tmp_path / "ledger.jsonl"
    write_notebook(root / "elicitation.ipynb", _cells(ledger))
    with lab_page(root, tmp_path / "jupyter", artifacts, "elicitation-failure.png", height=1100) as (lab, page):
        open_notebook(page, lab, "elicitation.ipynb")
        run_all_until(page, '.we0-question button.we0-question-accept:not([disabled])', 1, "the question's form",
                      restart=False)
        out = _answer(page, artifacts)
    assert "result: stop | Ordered. | answer: accept {'name': 'tea', 'count': 2} by panel" in out, out
    assert '"action": "accept"' in out and '"data": {"name": "tea", "count": 2}' in out, out
