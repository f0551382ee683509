"""Real browser: JupyterLab + chromium (Playwright) run a notebook whose agent asks for approval;
a person types in the panel — bad JSON first (the panel says so, nothing is recorded), then
corrected arguments — clicks Approve on one call and, with a reason, Deny on the other, while
the next cell waits for the decisions. The run resumes and that cell prints what ran.

Screenshots go to ``$WE0NB_ARTIFACTS`` (default ``test-artifacts/``); with
``WE0NB_UPDATE_SCREENSHOTS=1`` ``docs/img/approval.png`` is refreshed from them.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from nbutil_lab import lab_page, open_notebook, playwright_or_skip, run_all_until, write_notebook

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[1]

CELLS = [
    """from we0nb import We0Agent, ScriptedModel, text, tool, tool_call
from we0nb.notebook import RunPanel

XSS = '<img src=x onerror="window.__pwned=1">'
PAID = []

@tool(requires_approval=True)
def pay(to: str, amount: int) -> str:
    \"\"\"Pay someone: a person approves every call.\"\"\"
    PAID.append((to, amount))
    return f"paid {amount} to {to}"

agent = We0Agent(ScriptedModel([
    [text("Paying the two invoices."), tool_call("pay", {"to": "ann", "amount": 5}),
     tool_call("pay", {"to": XSS, "amount": 6})],
    [text("Done: one paid, one denied.")],
]), tools=[pay])
panel = RunPanel(agent, session_id="ses_browser_approval", title="approval")
panel.start("Pay the invoices")""",
    "r = await panel.wait(decisions=True)",
    "t = await agent.transcript('ses_browser_approval')\n"
    "denied = t.messages[1].tool_parts[1]\n"
    "print('result:', r.result, '|', r.text, '| paid:', PAID, '| denied:', denied.state.metadata)",
]


def _decide(page, artifacts: Path) -> None:
    """Bad JSON, then corrected arguments and Approve on the first call; a reason and Deny on the second."""
    rows = page.locator(".we0-approval")
    first, second = rows.nth(0), rows.nth(1)
    assert "why: pay requires approval for every call" in first.inner_text()
    assert "&lt;img" not in second.inner_text() and "<img src=x" in second.inner_text()  # shown as text

    # bad JSON: the row says so, nothing is recorded, the buttons come back
    first.locator("textarea").fill('{"to": "ann", "amount": ')
    first.locator("button.we0-approve").click()
    first.locator(".we0-approval-message:has-text('not valid JSON')").wait_for(timeout=60_000)
    assert "Nothing was recorded." in first.locator(".we0-approval-message").inner_text()
    page.wait_for_selector(".we0-approval >> nth=0 >> button.we0-approve:not([disabled])", timeout=60_000)

    # corrected arguments, then Approve
    first.locator("textarea").fill('{"to": "ann", "amount": 50}')
    first.locator("button.we0-approve").click()
    first.locator(".we0-approval-message:has-text('Approved with the corrected arguments')").wait_for(timeout=60_000)
    page.wait_for_selector(".we0-status:has-text('1 call still awaits')", timeout=60_000)
    # the view shows the decision at once: the call is approved, one still awaits
    page.wait_for_function("""() => [...document.querySelectorAll('.we0-live')].some(e =>
        e.innerText.includes('approved, edited') && e.innerText.includes('1 call awaits'))""", timeout=60_000)
    panel_cell = page.locator(".jp-Notebook .jp-CodeCell").nth(0)
    panel_cell.scroll_into_view_if_needed()
    panel_cell.locator(".jp-Cell-outputWrapper").screenshot(path=str(artifacts / "approval.png"))

    # a reason, then Deny: the last decision resumes the run; the waiting cell returns
    second.locator("input").fill("not to <this> payee")
    second.locator("button.we0-deny").click()
    # (the text is read where it was found: the windowed notebook may hide that output again at
    # once, and a second look could then read an empty element)
    out = page.wait_for_function("""() => {
        if (document.querySelector('.jp-Dialog')) return '<dialog>';  // the kernel was replaced: see the caller
        const scroller = document.querySelector('.jp-NotebookPanel .jp-WindowedPanel-outer');
        if (scroller) scroller.scrollTop = scroller.scrollHeight;
        const hit = [...document.querySelectorAll('.jp-OutputArea-output')].find(e => e.innerText.includes('result:'));
        return hit ? hit.innerText : false;
    }""", timeout=180_000).json_value()
    if out == "<dialog>":
        raise _KernelReplaced()
    assert "result: stop | Done: one paid, one denied. | paid: [('ann', 50)]" in out, out
    assert "'denied': True, 'reason': 'not to <this> payee'" in out, out
    page.wait_for_selector(".we0-status:has-text('finished')", timeout=60_000)
    live = page.locator(".we0-live").first.inner_text()
    assert "approved, edited" in live and "denied" in live and "Done: one paid, one denied." in live
    assert page.evaluate("() => window.__pwned") is None
    assert page.locator(".jp-OutputArea img[src='x']").count() == 0
    panel_cell.scroll_into_view_if_needed()
    panel_cell.locator(".jp-Cell-outputWrapper").screenshot(path=str(artifacts / "approval-finished.png"))


class _KernelReplaced(Exception):
    pass


@pytest.mark.timeout(1800)  # with the wait for the browser slot
def test_approve_and_deny_clicked_in_jupyterlab(tmp_path, artifacts):
    playwright_or_skip()
    root = tmp_path / "root"
    root.mkdir()
    write_notebook(root / "approval.ipynb", CELLS)
    with lab_page(root, tmp_path / "jupyter", artifacts, "approval-failure.png", height=1100) as (lab, page):
        open_notebook(page, lab, "approval.ipynb")
        for attempt in range(3):  # the kernel replaced mid-way ("Select Kernel"): from the start again
            run_all_until(page, '.we0-approval button.we0-approve:not([disabled])', 2, 'the approval rows',
                          restart=attempt > 0)
            try:
                _decide(page, artifacts)
                break
            except _KernelReplaced:
                page.screenshot(path=str(artifacts / f"approval-kernel-replaced-{attempt}.png"), full_page=True)
                if attempt == 2:
                    raise
    if os.environ.get("WE0NB_UPDATE_SCREENSHOTS") == "1":
        img = REPO / "docs" / "img"
        img.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(artifacts / "approval.png", img / "approval.png")
