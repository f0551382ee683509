"""Real browser: JupyterLab + chromium (Playwright) run a notebook with the live view and
the run panel; Abort and Resume are clicked like a user would; model text cannot inject HTML.

Screenshots go to ``$WE0NB_ARTIFACTS`` (default ``test-artifacts/``). With
``WE0NB_UPDATE_SCREENSHOTS=1`` the README images ``docs/img/live-view.png`` and
``docs/img/panel.png`` are refreshed from them (a plain test run leaves the tree clean).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest

from nbutil_lab import (Lab, dismiss_toasts, kernel_ready, lab_page, launch_browser, open_notebook, playwright_or_skip,
                        run_all, started, write_notebook)

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[1]
XSS = '<img src=x onerror="window.__pwned=1">'

CELLS = [
    """import we0nb
from we0nb import We0Agent, ScriptedModel, text, tool, tool_call
from we0nb.testing import reasoning
from we0nb.notebook import RunPanel

XSS = '<img src=x onerror="window.__pwned=1">'

@tool(side_effects=False)
def search_docs(query: str) -> str:
    return "3 pages mention <resume>: recovery.md, abort.md, tools.md"

@tool
def send_email(to: str, body: str) -> str:
    return f"sent to {to}"

demo = We0Agent(ScriptedModel([
    [reasoning("The user wants a summary, then an email. Search first."),
     text("Let me search the docs."), tool_call("search_docs", {"query": "resume"}),
     tool_call("send_email", {"to": "team@example.com", "body": "<b>summary</b>"})],
    [text("Found 3 pages and emailed the team. Resume never runs a side effect twice.")],
], delay=0.01), tools=[search_docs, send_email])""",
    """result = await we0nb.show(demo, "Summarise the resume docs and email the team", session_id="ses_live")""",
    """agent = We0Agent(ScriptedModel([
    [text("Working on it: "), text([f"chunk{i} " for i in range(6000)])],
    [text("Resumed: all done.")],
], delay=0.02))
panel = RunPanel(agent, session_id="ses_panel", title="long answer")
panel.start("Write a long answer")""",
    # model, tool and user text that would inject HTML, through the live view and a panel (the
    # cells above stay clean: their screenshots are the README's images)
    """@tool(side_effects=False)
def echo(x: str) -> str:
    return x

def probe():
    return We0Agent(ScriptedModel([[text("probe " + XSS), tool_call("echo", {"x": XSS})],
                                   [text("probe end " + XSS)]]), tools=[echo])

await we0nb.show(probe(), XSS, session_id="ses_probe")
probe_panel = RunPanel(probe(), session_id="ses_probe_panel", title=XSS)
probe_panel.start(XSS)""",
]


def _notebook(path: Path) -> None:
    nb = {
        "cells": [{"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {}, "outputs": [],
                   "source": src} for i, src in enumerate(CELLS)],
        "metadata": {"kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
                     "language_info": {"name": "python"}},
        "nbformat": 4, "nbformat_minor": 5,
    }
    path.write_text(json.dumps(nb, indent=1))


def _open_and_run(page, lab: Lab, attempt: int) -> None:
    if attempt == 0:
        open_notebook(page, lab, "demo.ipynb")
    restart, state = attempt > 0, "not started"
    for _ in range(4):
        kernel_ready(page, kernel="Python 3 (ipykernel)")
        run_all(page, restart=restart)
        restart = True  # any further run starts from a fresh kernel
        if not started(page):  # right after the kernel dialog, Run All can be dropped
            continue
        # Ready: the live view of cell 2 finished and the panel of cell 3 streams. JupyterLab
        # sometimes replaces the kernel mid-run and asks "Select Kernel" (the later cells then
        # run in a new kernel, or not at all): accept it and run everything again.
        state = page.wait_for_function("""() => {
            if (document.querySelector('.jp-Dialog')) return 'dialog';
            if ([...document.querySelectorAll('.jp-Notebook .jp-OutputArea-output')]
                    .some(e => e.innerText.includes('most recent call last'))) return 'error';
            const ready = document.querySelector(".we0-live .we0-head[data-status='finished']")
                && document.querySelector("button.we0-abort:not([disabled])")
                && [...document.querySelectorAll('.we0-live')].some(e => e.innerText.includes('chunk40 '))
                && [...document.querySelectorAll('.we0-live')].filter(e => e.innerText.includes('probe end ')).length >= 2;
            return ready ? 'ready' : null;
        }""", timeout=120_000).json_value()
        if state == "ready":
            dismiss_toasts(page)
            return
    raise AssertionError(f"the notebook did not run through in a stable kernel (last state: {state!r})")


@pytest.mark.timeout(1800)  # up to three attempts, and the wait for the browser slot
def test_jupyterlab_abort_resume_and_no_xss(tmp_path, artifacts):
    playwright = playwright_or_skip()
    root = tmp_path / "root"
    root.mkdir()
    _notebook(root / "demo.ipynb")
    with lab_page(root, tmp_path / "jupyter", artifacts, "browser-failure.png") as (lab, page):
        for attempt in range(3):  # a fresh kernel occasionally times out: retry
            try:
                _open_and_run(page, lab, attempt)
                break
            except playwright.TimeoutError:
                page.screenshot(path=str(artifacts / f"browser-timeout-{attempt}.png"), full_page=True)
                if attempt == 2:
                    raise
        cells = page.locator(".jp-Notebook .jp-CodeCell")
        live_cell = cells.nth(1)
        live_cell.scroll_into_view_if_needed()
        live_cell.locator(".we0-live").screenshot(path=str(artifacts / "live-view.png"))
        live_text = live_cell.locator(".we0-live").inner_text()
        assert "search_docs" in live_text and "send_email" in live_text
        assert "completed" in live_text
        assert "Resume never runs a side effect twice." in live_text
        assert "<resume>" in live_text and '"<b>summary</b>"' in live_text  # tool text shown as text

        # Abort while it streams
        panel_cell = cells.nth(2)
        panel_cell.locator("button.we0-abort").click()
        panel_cell.locator(".we0-status:has-text('aborted')").wait_for(timeout=60_000)
        panel_cell.locator("button.we0-resume:not([disabled])").wait_for(timeout=60_000)
        panel_cell.locator(".we0-live .we0-head[data-status='aborted']").wait_for(timeout=60_000)
        panel_cell.scroll_into_view_if_needed()
        panel_cell.screenshot(path=str(artifacts / "panel-aborted.png"))
        assert panel_cell.locator("button.we0-abort[disabled]").count() == 1

        # Resume: the finished transcript
        panel_cell.locator("button.we0-resume").click()
        panel_cell.locator(".we0-status:has-text('finished')").wait_for(timeout=120_000)
        page.wait_for_function("""() => [...document.querySelectorAll('.we0-live')]
            .some(e => e.innerText.includes('Resumed: all done.'))""", timeout=120_000)
        panel_cell.locator(".we0-live .we0-head[data-status='finished']").wait_for(timeout=60_000)
        panel_text = panel_cell.locator(".we0-live").inner_text()
        assert "UnfinishedAssistantMessage" in panel_text
        assert "chunk0 chunk1" in panel_text
        panel_cell.scroll_into_view_if_needed()
        dismiss_toasts(page)
        panel_cell.locator(".jp-Cell-outputWrapper").screenshot(path=str(artifacts / "panel-finished.png"))

        # XSS: model, tool and user text shows as text, nothing was injected
        probe_cell = cells.nth(3)
        probe_views = probe_cell.locator(".we0-live")
        assert probe_views.count() == 2  # the live view, the panel's
        for i in range(2):
            probe_text = probe_views.nth(i).inner_text()
            assert probe_text.count(XSS) >= 4, probe_text  # the prompt, the text, the call's input and output
        assert page.evaluate("() => window.__pwned") is None
        assert page.locator(".jp-OutputArea img[src='x']").count() == 0
        page.screenshot(path=str(artifacts / "notebook.png"), full_page=True)
    if os.environ.get("WE0NB_UPDATE_SCREENSHOTS") == "1":
        img = REPO / "docs" / "img"
        img.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(artifacts / "live-view.png", img / "live-view.png")
        shutil.copyfile(artifacts / "panel-finished.png", img / "panel.png")


# --------------------------------------------------------------------------- Abort while another cell awaits

ABORT_CELLS = [
    """from we0nb import We0Agent, ScriptedModel, text, tool, tool_call
from we0nb.notebook import RunPanel

ORDERS = []

@tool
def order_tea(quantity: int) -> str:
    ORDERS.append(quantity)
    return "ordered"

agent = We0Agent(ScriptedModel([
    [text([f"w{i} " for i in range(300)]), tool_call("order_tea", {"quantity": 1})],
    [text("done")],
], delay=0.1), tools=[order_tea])
panel = RunPanel(agent, session_id="ses_wait")
panel.start("go")""",
    "r = await panel.wait()",
    "import ipykernel\nprint('orders:', ORDERS, '| status:', panel.status, '| latency:', panel.last_abort_latency,"
    " '| ipykernel', ipykernel.__version__)",
]


@pytest.mark.timeout(1800)  # with the wait for the browser slot
@pytest.mark.parametrize("version", ["6.29.5", "7.0.1"])
def test_abort_click_while_another_cell_awaits_stops_the_run(tmp_path, artifacts, version):
    """Run All: cell 2 awaits ``panel.wait()`` while the run streams; the Abort click stops the run
    before its side effect (``order_tea``), on an ipykernel 6 and a 7 kernel in their own venvs."""
    playwright = playwright_or_skip()
    from kernel_venvs import write_kernelspec

    root = tmp_path / "root"
    root.mkdir()
    name = write_kernelspec(tmp_path / "jupyter" / "data", version)
    write_notebook(root / "abort.ipynb", ABORT_CELLS, kernel=name, display=f"Python (ipykernel {version})")
    with lab_page(root, tmp_path / "jupyter", artifacts, f"abort-while-awaiting-{version}-failure.png") as (lab, page):
        open_notebook(page, lab, "abort.ipynb")
        state = "not started"
        for attempt in range(4):
            try:
                kernel_ready(page, kernel=f"Python (ipykernel {version})")
            except (playwright.TimeoutError, AssertionError) as exc:  # a dialog that stays: load again
                state = f"dialog stuck: {exc}"
                page.reload(wait_until="domcontentloaded", timeout=120_000)
                page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
                continue
            run_all(page, restart=attempt > 0)
            if not started(page):  # right after the kernel dialog, Run All can be dropped
                continue
            # streaming, Abort enabled, and the second cell is running (awaiting the panel);
            # JupyterLab sometimes replaces the kernel as it starts and asks "Select Kernel":
            # accept it and run everything again from a fresh kernel
            state = page.wait_for_function("""() => {
                if (document.querySelector('.jp-Dialog')) return 'dialog';
                const live = [...document.querySelectorAll('.we0-live')].some(e => e.innerText.includes('w30 '));
                const prompts = document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt');
                return (live && document.querySelector('button.we0-abort:not([disabled])')
                    && prompts.length > 1 && prompts[1].innerText.includes('*')) ? 'ready' : null;
            }""", timeout=180_000).json_value()
            if state == "ready":
                break
        assert state == "ready", f"the run never reached the abort point ({state})"
        clicked = time.time()
        page.click("button.we0-abort")
        found = page.wait_for_function("""() => {
            // JupyterLab renders only the cells in view: keep the last one in view, and read
            // the text here (the element may be unrendered again a moment later)
            const scroller = document.querySelector('.jp-NotebookPanel .jp-WindowedPanel-outer');
            if (scroller) scroller.scrollTop = scroller.scrollHeight;
            const el = [...document.querySelectorAll('.jp-OutputArea-output')]
                .find(e => e.innerText.includes('orders:'));
            return el ? el.innerText : false;
        }""", timeout=180_000)
        seen = time.time()
        out = found.json_value()
        page.screenshot(path=str(artifacts / f"abort-while-awaiting-{version}.png"), full_page=True)
        assert f"| ipykernel {version}" in out, out
        assert "orders: [] | status: aborted" in out, out  # the side effect never ran
        latency = float(out.split("| latency:")[1].split("|")[0])
        assert 0 <= latency <= seen - clicked + 1.0, (latency, seen - clicked)


# --------------------------------------------------------------------------- a saved tutorial, untrusted


@pytest.mark.timeout(1800)  # with the wait for the browser slot
def test_a_saved_tutorial_reads_well_untrusted(tmp_path, artifacts):
    """What a Binder user sees first: the tutorial as saved, not trusted (its <style> is removed by
    JupyterLab's sanitiser); the inline styles keep tables, badges and text readable."""
    playwright_or_skip()
    root = tmp_path / "root"
    root.mkdir()
    shutil.copyfile(REPO / "notebooks" / "02-abort-and-resume.ipynb", root / "tutorial.ipynb")
    with lab_page(root, tmp_path / "jupyter", artifacts, "tutorial-failure.png") as (lab, page):
        page.goto(f"{lab.url}/lab/tree/tutorial.ipynb", wait_until="domcontentloaded", timeout=120_000)
        page.wait_for_selector(".jp-OutputArea-output .we0", timeout=120_000)
        facts = page.evaluate("""() => {
            const out = document.querySelector('.jp-Notebook');
            const badge = out.querySelector('.we0-badge');
            const cell = out.querySelector('.we0-tools td');
            const text = out.querySelector('.we0-text');
            const head = out.querySelector('.we0-turn > div');
            return {
                styles: out.querySelectorAll('.jp-OutputArea-output style').length,
                badgeBg: getComputedStyle(badge).backgroundColor,
                badgeColor: getComputedStyle(badge).color,
                cellBorder: getComputedStyle(cell).borderTopWidth,
                whiteSpace: getComputedStyle(text).whiteSpace,
                head: head.innerText,
            };
        }""")
        table = page.locator(".jp-OutputArea-output .we0:has(.we0-tools)").first
        table.scroll_into_view_if_needed()
        table.screenshot(path=str(artifacts / "tutorial-untrusted.png"))
        assert facts["styles"] == 0, "the notebook is trusted: this test would not see the sanitised view"
        assert facts["badgeBg"] not in ("rgba(0, 0, 0, 0)", "transparent") and facts["badgeColor"] == "rgb(255, 255, 255)"
        assert facts["cellBorder"] != "0px"
        assert facts["whiteSpace"] == "pre-wrap"
        assert re.match(r"^\w+\s+\S", facts["head"]), facts["head"]  # "USER 2026-…", not "USER2026-…"


RAW_WIDGET = re.compile(r"^\s*(VBox|HBox|Box|GridBox|HTML|Label|Button|Output|IntProgress|FloatProgress|Textarea|"
                        r"Text|Dropdown|Checkbox)\(", re.M)


@pytest.mark.timeout(1800)  # with the wait for the browser slot
def test_every_saved_tutorial_opens_without_a_raw_widget_repr(tmp_path, artifacts):
    """What a Binder visitor sees before running anything (issue 36): each saved tutorial, untrusted,
    shows no widget's Python repr (``VBox(children=(HTML(value=''), Button(…``) and no widget error;
    08's batch views read as their final state (the items ended, not tqdm's first ``0/200``)."""
    playwright_or_skip()
    root = tmp_path / "root"
    root.mkdir()
    names = sorted(p.name for p in (REPO / "notebooks").glob("*.ipynb"))
    for name in names:
        shutil.copyfile(REPO / "notebooks" / name, root / name)
    with lab_page(root, tmp_path / "jupyter", artifacts, "saved-tutorials-failure.png") as (lab, page):
        seen = {}
        for name in names:
            # (?reset: a fresh workspace, the previous notebook's tab is not restored)
            page.goto(f"{lab.url}/lab/tree/{name}?reset", wait_until="domcontentloaded", timeout=120_000)
            page.wait_for_selector(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output",
                                   state="attached", timeout=120_000)
            page.wait_for_timeout(1500)  # the outputs below the first render too
            seen[name] = page.evaluate("""() => [...document.querySelectorAll(
                '.jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output')].map(e => e.innerText)""")
            if name.startswith("08"):
                page.locator(".we0-batch-view").first.scroll_into_view_if_needed()
                page.screenshot(path=str(artifacts / "saved-08-batch.png"))
        for name, outputs in seen.items():
            assert outputs, f"{name}: no saved output rendered"
            raw = [o[:80] for o in outputs if RAW_WIDGET.search(o) or "Error displaying widget" in o]
            assert not raw, f"{name}: raw widget text on first open: {raw}"
        views = [o for o in seen[next(n for n in names if n.startswith("08"))] if o.startswith("reviews-v1")]
        assert len(views) == 2, views
        assert re.search(r"aborted · \d+/200 ended", views[0]) and "0/200" not in views[0], views[0]
        assert "finished · 200/200 ended" in views[1], views[1]


@pytest.mark.timeout(1800)  # with the wait for the browser slot
def test_the_tool_table_keeps_its_columns_as_calls_change(tmp_path, artifacts):
    """Issue 36: the columns of the tool table do not move between running, aborted and finished,
    a JSON input wraps at its width (not a key per line), and a call id is never broken mid-token."""
    playwright = playwright_or_skip()
    from we0nb.messages import ToolPart, ToolStateCompleted, ToolStateError, ToolStateRunning, ToolTime
    from we0nb.notebook.html import tool_table_html, wrap

    call = "call_0661b8fca30839313f7980aa"
    args = {"number": "INV-2", "amount": 4800, "supplier": "Acme Industrial Supplies", "note": "second instalment"}

    def part(state):
        return ToolPart(id="prt_1", session_id="ses_1", message_id="msg_1", call_id=call, tool="pay_invoice",
                        state=state)

    states = {
        "running": ToolStateRunning(input=args, time=ToolTime(start=1.0)),
        "aborted": ToolStateError(input=args, error="Interrupted: the run was aborted while the tool ran. " * 3,
                                  metadata={"interrupted": True}, time=ToolTime(start=1.0, end=2.0)),
        "finished": ToolStateCompleted(input=args, output="paid INV-2: 4800 " * 12, time=ToolTime(start=1.0, end=2.0)),
    }
    page_html = "".join(f"<div id='{k}' style='width:900px'>{wrap(tool_table_html([part(s)]))}</div>"
                        for k, s in states.items())
    with playwright.sync_playwright() as p:
        browser = launch_browser(p)
        try:
            page = browser.new_page(viewport={"width": 1000, "height": 1400})
            page.set_content(f"<!DOCTYPE html><html><body>{page_html}</body></html>")
            facts = page.evaluate("""() => Object.fromEntries(['running', 'aborted', 'finished'].map(k => {
                const t = document.querySelector('#' + k + ' table');
                const input = t.querySelector('tbody td:nth-child(2)');
                const id = t.querySelector('.we0-id');
                return [k, {cols: [...t.querySelectorAll('th')].map(th => Math.round(th.getBoundingClientRect().width)),
                            inputLines: (() => {  // the text's own height (the cell is as tall as its row)
                                const r = document.createRange();
                                r.selectNodeContents(input);
                                return r.getBoundingClientRect().height / parseFloat(getComputedStyle(input).lineHeight);
                            })(),
                            idHeight: id.getBoundingClientRect().height,
                            idLine: parseFloat(getComputedStyle(id).lineHeight) || 16}];
            }))""")
            page.screenshot(path=str(artifacts / "tool-table-states.png"), full_page=True)
        finally:
            browser.close()
    assert facts["running"]["cols"] == facts["aborted"]["cols"] == facts["finished"]["cols"], facts
    for k, f in facts.items():
        assert f["inputLines"] < len(args), (k, f)  # not one key per line
        assert f["idHeight"] <= 1.5 * f["idLine"], (k, f)  # the id on one line: never broken mid-token


def test_a_long_badge_stays_inside_its_cell(tmp_path, artifacts):
    """A probe saw "interrupted (resume)" run past its narrow status column over the duration
    ("1.97 s" read "97 s"): a badge wraps inside its cell instead, with the stylesheet and with the
    inline styles a sanitised (untrusted) output keeps."""
    playwright = playwright_or_skip()
    from we0nb.messages import ToolPart, ToolStateError, ToolTime
    from we0nb.notebook.html import tool_table_html, wrap
    from we0nb.notebook.styles import inline_styles

    part = ToolPart(id="prt_1", session_id="ses_1", message_id="msg_1", call_id="call_1", tool="send_email",
                    state=ToolStateError(input={"to": "a@example.com"}, error="Interrupted by resume.",
                                         metadata={"interrupted": True, "reason": "resume", "in_doubt": True},
                                         time=ToolTime(start=1.0, end=2.97)))
    table = tool_table_html([part])
    page_html = (f"<div id='styled' style='width:560px'>{wrap(table)}</div>"  # (stylesheet and inline styles)
                 f"<div id='inline' style='width:560px'>{inline_styles(f'<div class={chr(39)}we0{chr(39)}>{table}</div>')}</div>")
    with playwright.sync_playwright() as p:
        browser = launch_browser(p)
        try:
            page = browser.new_page(viewport={"width": 800, "height": 800})
            page.set_content(f"<!DOCTYPE html><html><body>{page_html}</body></html>")
            spill = page.evaluate("""() => [...document.querySelectorAll('.we0-badge')].map(b => {
                const cell = b.closest('td').getBoundingClientRect(), r = b.getBoundingClientRect();
                return {text: b.textContent, over: Math.round(r.right - cell.right)};
            })""")
            page.screenshot(path=str(artifacts / "tool-table-long-badge.png"), full_page=True)
        finally:
            browser.close()
    assert any(b["text"] == "interrupted (resume)" for b in spill), spill
    assert all(b["over"] <= 0 for b in spill), spill


BATCH_CELLS = [
    """import asyncio
from we0nb import FunctionModel, We0Agent, text

async def slow(request):
    await asyncio.sleep(0.4)
    return [text("ok")]

agent = We0Agent(FunctionModel(slow))
task = asyncio.create_task(agent.batch([f"p{i}" for i in range(40)], name="dark", concurrency=2))""",
    """result = await task
print("stopped:", result.stopped, "| counts:", result.counts)""",
]


@pytest.mark.timeout(1800)  # with the wait for the browser slot
def test_batch_abort_clicked_in_the_dark_theme(tmp_path, artifacts):
    """Issue 36 in JupyterLab Dark: the batch view's Abort is clicked as a person would; the view's
    counts then sum to the items and agree with the result; the ended button is neutral, not a
    disabled red on red, and says "Aborted"."""
    playwright_or_skip()
    root = tmp_path / "root"
    root.mkdir()
    write_notebook(root / "batch.ipynb", BATCH_CELLS)
    settings = tmp_path / "jupyter" / "config" / "lab" / "user-settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "themes.jupyterlab-settings").write_text(json.dumps({"theme": "JupyterLab Dark"}))
    with lab_page(root, tmp_path / "jupyter", artifacts, "batch-dark-failure.png") as (lab, page):
        open_notebook(page, lab, "batch.ipynb")
        for attempt in range(3):
            kernel_ready(page, kernel="Python 3 (ipykernel)")
            run_all(page, restart=attempt > 0)
            if not started(page):
                continue
            try:
                page.wait_for_function("""() => [...document.querySelectorAll('.we0-batch-view')]
                    .some(e => /[1-9]\\d*\\/40 ended/.test(e.innerText))""", timeout=120_000)
                break
            except Exception:
                if attempt == 2:
                    raise
        dismiss_toasts(page)
        page.locator(".we0-batch button:has-text('Abort')").click()
        out = page.wait_for_function("""() => {
            const hit = [...document.querySelectorAll('.jp-OutputArea-output')]
                .find(e => e.innerText.includes('stopped:'));
            return hit ? hit.innerText : false;
        }""", timeout=120_000).json_value()
        page.wait_for_selector(".we0-batch button:has-text('Aborted')", timeout=60_000)
        facts = page.evaluate("""() => {
            const b = document.querySelector('.we0-batch button');
            const view = document.querySelector('.we0-batch-view');
            return {theme: document.body.dataset.jpThemeLight, view: view.innerText,
                    buttonBg: getComputedStyle(b).backgroundColor, disabled: b.disabled,
                    classes: b.className};
        }""")
        page.locator(".we0-batch").first.screenshot(path=str(artifacts / "batch-dark-aborted.png"))
    assert facts["theme"] == "false", facts  # the dark theme is the one shown
    assert "stopped: aborted" in out, out
    counts = {k: int(v) for k, v in re.findall(r"'(\w+)': (\d+)", out)}
    assert sum(counts.values()) == 40, out
    shown = {k: int(v) for k, v in re.findall(r"\b(pending|running|stop|failed|aborted) (\d+)\b", facts["view"])}
    assert shown == counts, (facts["view"], out)  # the view agrees with the result, and sums to 40
    assert facts["disabled"] and "mod-danger" not in facts["classes"], facts
