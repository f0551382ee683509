"""Approval in the notebook layer without a kernel: the panel's rows (Approve / Deny, arguments
edited as JSON), clicks from another thread, the resume once all are decided, a panel rebuilt on
a stored session, and how the live view and the transcript HTML show awaiting / approved / denied."""

from __future__ import annotations

import asyncio
import html
import json
import re
import threading
import time

import pytest

from we0nb import MemoryPersistence, ScriptedModel, SqlPersistence, We0Agent, text, tool, tool_call, user_message
from we0nb.notebook import RunPanel
from we0nb.notebook.approvals import parse_arguments
from we0nb.notebook.html import esc, render_html, render_text

pytest.importorskip("ipywidgets")

XSS = '<img src=x onerror="window.__pwned=1">'


class Handle:
    def __init__(self):
        self.bundles = []

    def update(self, bundle):
        self.bundles.append(bundle)


def make_agent(ran: list, steps=None, persistence=None):
    @tool(requires_approval=True)
    def pay(to: str, amount: int) -> str:
        """Pay someone: a person approves every call."""
        ran.append((to, amount))
        return f"paid {amount} to {to}"

    @tool(side_effects=False)
    def balance() -> int:
        return 100

    steps = steps or [[text("Paying both."), tool_call("pay", {"to": XSS, "amount": 5}),
                       tool_call("pay", {"to": "bob", "amount": 6})],
                      [text("One paid, one denied.")]]
    return We0Agent(ScriptedModel(steps), tools=[pay, balance], persistence=persistence or MemoryPersistence())


def panel_for(agent, sid="ses_ap"):
    handles = []
    panel = RunPanel(agent, session_id=sid, display=lambda b: handles.append(Handle()) or handles[-1])
    return panel, handles


async def until(pred, timeout=20):
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, "timed out waiting"
        await asyncio.sleep(0.01)


def click_from_thread(button, name="subshell-fake"):
    t = threading.Thread(target=button.click, name=name)
    t.start()
    t.join()


def said(row) -> str:
    """The row's message as the person reads it."""
    return html.unescape(re.sub(r"<[^>]+>", "", row.message.value))


async def awaiting(agent, sid="ses_ap"):
    return [p.call_id for p in await agent.pending_approvals(sid)]


# --------------------------------------------------------------------------- the rows


async def test_a_run_that_needs_approval_shows_a_row_per_call():
    ran = []
    agent = make_agent(ran)
    panel, handles = panel_for(agent)
    panel.start("pay")
    result = await panel.wait()
    assert result.result == "approval" and panel.status == "awaiting approval"
    assert [r.call_id for r in panel.approvals.rows] == [p.call_id for p in result.approvals]
    row = panel.approvals.rows[0]
    # tool, call id, arguments (escaped) and why
    assert "<img" not in row.info.value and "&lt;img src=x onerror=" in row.info.value
    assert "pay requires approval for every call" in row.info.value and row.call_id in row.info.value
    assert json.loads(row.args.value) == {"to": XSS, "amount": 5}
    assert not row.approve_button.disabled and not row.deny_button.disabled
    assert panel.resume_button.disabled and panel.abort_button.disabled  # decide first
    assert "2 calls await a decision" in panel.status_label.value
    # the saved notebook's plain text (the widget's fallback) lists the calls
    plain = panel._widget_bundle()["text/plain"]
    assert plain.startswith("status: awaiting approval · session ses_ap")
    assert '  tool pay({"amount": 6, "to": "bob"}) awaiting approval (why: pay requires approval for every call)' \
        in plain.splitlines()
    # the live view says what is left to a person
    final = handles[0].bundles[-1]
    assert "data-status='approval'" in final["text/html"] and "awaiting approval" in final["text/html"]
    assert "2 calls await a person's decision" in final["text/plain"]
    assert ran == []


async def test_bad_json_or_schema_records_nothing_then_an_edit_is_approved_from_another_thread():
    ran = []
    agent = make_agent(ran)
    panel, _ = panel_for(agent)
    panel.start("pay")
    await panel.wait()
    first, second = panel.approvals.rows
    cases = [('{"to": "x", "amount": ', "are not valid JSON"), ("[1, 2]", "must be a JSON object"),
             ("", "must be a JSON object"), ('{"to": "x", "amount": "lots"}', "Invalid arguments for tool 'pay'"),
             ('{"to": "x"}', "amount")]
    for bad, needle in cases:
        first.args.value, first.message.value = bad, ""
        click_from_thread(first.approve_button)
        await until(lambda: not first.approve_button.disabled and first.message.value)
        assert needle in said(first) and "Nothing was recorded." in said(first), (bad, said(first))
        assert "#d32f2f" in first.message.value
        assert first.decision is None
        assert len(await awaiting(agent)) == 2  # nothing was recorded
    first.args.value = json.dumps({"to": "carol", "amount": 7})
    click_from_thread(first.approve_button)
    await until(lambda: first.decision == "approved")
    assert "corrected arguments" in first.message.value and first.approve_button.disabled
    assert panel.approvals.click_threads[-1] == "subshell-fake"
    assert await awaiting(agent) == [second.call_id]
    assert panel.status == "awaiting approval" and "1 call still awaits" in panel.status_label.value
    # the view shows the decision at once (before any resume)
    view = panel.view.bundle(final=True)
    assert "1 call awaits a person's decision" in view["text/plain"]
    assert '"to": "carol"' not in view["text/plain"] and "[approved, arguments corrected]" in view["text/plain"]
    assert ">approved, edited<" in view["text/html"]
    # the last decision resumes the run
    second.reason.value = "not <bob>"
    click_from_thread(second.deny_button)
    result = await asyncio.wait_for(panel.wait(decisions=True), 20)
    assert result.result == "stop" and result.text == "One paid, one denied."
    assert panel.status == "finished" and panel.approvals.rows == []
    assert ran == [("carol", 7)]
    t = await agent.transcript("ses_ap")
    paid, denied = t.messages[1].tool_parts
    assert paid.state.input == {"to": "carol", "amount": 7}
    assert paid.state.metadata["original_input"] == {"to": XSS, "amount": 5}
    assert denied.state.metadata.items() >= {"denied": True, "reason": "not <bob>"}.items()


async def test_an_unchanged_text_approves_the_models_arguments():
    ran = []
    agent = make_agent(ran, steps=[[tool_call("pay", {"to": "ann", "amount": 1})], [text("ok")]])
    panel, _ = panel_for(agent)
    panel.start("pay")
    await panel.wait()
    (row,) = panel.approvals.rows
    row.args.value = '{"amount": 1,   "to": "ann"}'  # reformatted, same object
    row.approve_button.click()
    result = await asyncio.wait_for(panel.wait(decisions=True), 20)
    assert result.result == "stop" and ran == [("ann", 1)]
    t = await agent.transcript("ses_ap")
    part = t.messages[1].tool_parts[0]
    assert part.approval == "approved" and part.approval_detail.input is None  # nothing corrected
    assert "original_input" not in part.state.metadata


def test_parse_arguments():
    assert parse_arguments('{"a": 1}', {"a": 1}) is None
    assert parse_arguments('{"a": 2}', {"a": 1}) == {"a": 2}
    for bad in ("{", "1", "null", " ", '"x"'):
        with pytest.raises(ValueError):
            parse_arguments(bad, {})


async def test_two_clicks_at_once_both_record_and_resume_once():
    ran = []
    agent = make_agent(ran)
    panel, _ = panel_for(agent)
    panel.start("pay")
    await panel.wait()
    a, b = panel.approvals.rows
    threads = [threading.Thread(target=a.approve_button.click, name="subshell-1"),
               threading.Thread(target=b.deny_button.click, name="subshell-2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    result = await asyncio.wait_for(panel.wait(decisions=True), 20)
    assert result.result == "stop" and ran == [(XSS, 5)]
    t = await agent.transcript("ses_ap")
    assert len([m for m in t.messages if m.info.role == "assistant"]) == 2  # one resume, one more step


async def test_a_decision_taken_elsewhere_and_a_busy_session_say_so_in_the_row():
    ran = []
    agent = make_agent(ran)
    panel, _ = panel_for(agent)
    panel.start("pay")
    await panel.wait()
    a, b = panel.approvals.rows
    await agent.deny("ses_ap", a.call_id, reason="from the CLI")  # another process decided it
    a.approve_button.click()
    await until(lambda: "already denied" in said(a) and a.decision is not None)
    assert said(a).startswith("Not approved: call ") and said(a).endswith("Nothing was recorded.")
    assert a.approve_button.disabled and a.deny_button.disabled  # the store says it is decided: the row is closed
    # a run holds the session: the decision is refused, nothing recorded
    lease = await agent.persistence.acquire_lease("ses_ap", "run_other")
    try:
        b.deny_button.click()
        await until(lambda: "a run holds this session" in said(b))
    finally:
        await lease.release()
    assert await awaiting(agent) == [b.call_id]
    await panel.deny(b.call_id)  # what the button does, from code
    result = await asyncio.wait_for(panel.wait(decisions=True), 20)
    assert result.result == "stop" and ran == []


async def test_a_panel_rebuilt_on_the_store_finds_the_awaiting_calls(tmp_path):
    """As after a kernel restart: a new process, a new store object, a new panel on the session."""
    url = f"sqlite:///{tmp_path / 'ap.db'}"
    ran = []
    first = SqlPersistence(url)
    try:
        r = await make_agent(ran, persistence=first).invoke(session_id="ses_ap", messages=[user_message("pay")])
        assert r.result == "approval"
    finally:
        await first.close()
    store = SqlPersistence(url)
    try:
        agent = make_agent(ran, steps=[[text("One paid, one denied.")]], persistence=store)  # the turn goes on
        panel, handles = panel_for(agent)
        await until(lambda: panel.status == "awaiting approval")
        assert [row.call_id for row in panel.approvals.rows] == [p.call_id for p in r.approvals]
        shown = panel.view.bundle(final=True)["text/plain"]  # the stored turn, awaiting calls included
        assert "[user] pay" in shown and "[assistant] Paying both." in shown and shown.count("awaiting approval") == 2
        # the view's badge says what the panel's status says (it said a grey "idle" under it)
        assert shown.startswith("we0nb run [approval]")
        badge = re.search(r"data-status='(\w+)'[^>]*>\s*<span class='we0-badge[^>]*>([^<]+)<", panel.view.html(final=True))
        assert badge is not None and badge.groups() == ("approval", "awaiting approval"), badge
        # Resume before deciding runs nothing: the calls still wait, and the panel says so
        panel.resume()
        assert await panel.wait() is None and panel.status == "awaiting approval"
        a, b = panel.approvals.rows
        a.approve_button.click()
        await until(lambda: a.decision == "approved")
        b.deny_button.click()
        result = await asyncio.wait_for(panel.wait(decisions=True), 20)
        assert result.text == "One paid, one denied." and ran == [(XSS, 5)]
        assert "One paid, one denied." in handles[0].bundles[-1]["text/html"]
        # the view started from the stored turn, and the resume updated its calls in place, in order
        plain = handles[0].bundles[-1]["text/plain"].splitlines()
        assert plain[1] == "[user] pay" and plain[2] == "[assistant] Paying both."
        assert plain[3].startswith("  tool pay(") and "[approved]" in plain[3] and " denied -> " in plain[4]
    finally:
        await store.close()


async def test_a_decision_right_after_the_panel_is_made_shows_the_turn_in_order():
    """approval.md's cell: a panel made on a stored session, and a decision at once (before the
    panel's own look at the store had ended). The user's message came after the decided call's."""
    ran = []
    agent = make_agent(ran, steps=[[tool_call("pay", {"to": "ACME", "amount": 80})], [text("Paid.")]])
    await agent.invoke(session_id="ses_now", messages=[user_message("pay ACME")])
    panel, _ = panel_for(agent, "ses_now")
    waiting = await agent.pending_approvals("ses_now")
    await panel.approve(waiting[0].call_id)
    result = await asyncio.wait_for(panel.wait(decisions=True), 20)
    assert result.result == "stop" and panel.status == "finished" and ran == [("ACME", 80)]
    assert [t.info.role for t in panel.view.turns] == ["user", "assistant", "assistant"]
    assert panel.view.bundle(final=True)["text/plain"].splitlines()[1] == "[user] pay ACME"


async def test_a_resume_right_after_the_panel_is_made_shows_the_turn_once_in_order():
    agent = make_agent([], steps=[[text("Paying both."), tool_call("pay", {"to": "bob", "amount": 6})],
                                  [text("Done.")]])
    await agent.invoke(session_id="ses_now2", messages=[user_message("pay bob")])
    panel, _ = panel_for(agent, "ses_now2")
    panel.resume()  # (calls await a decision: nothing runs, the rows show)
    assert await panel.wait() is None and panel.status == "awaiting approval"
    assert [t.info.role for t in panel.view.turns] == ["user", "assistant"]
    assert len(panel.approvals.rows) == 1


async def test_wait_for_decisions_keeps_waiting_through_a_second_request():
    ran = []
    agent = make_agent(ran, steps=[[tool_call("pay", {"to": "a", "amount": 1})],
                                   [tool_call("pay", {"to": "b", "amount": 2})], [text("both paid")]])
    panel, _ = panel_for(agent)
    panel.start("pay twice")
    waiter = asyncio.ensure_future(panel.wait(decisions=True))
    await until(lambda: panel.status == "awaiting approval")
    panel.approvals.rows[0].approve_button.click()
    await until(lambda: panel.status == "awaiting approval" and panel.approvals.rows
                and panel.approvals.rows[0].part.state.input == {"to": "b", "amount": 2})
    assert not waiter.done()
    await panel.approve(panel.approvals.rows[0].call_id)
    result = await asyncio.wait_for(waiter, 20)
    assert result.text == "both paid" and ran == [("a", 1), ("b", 2)]


# --------------------------------------------------------------------------- how calls read


async def _decided_transcript():
    ran = []
    agent = make_agent(ran, steps=[[tool_call("pay", {"to": XSS, "amount": 5}), tool_call("pay", {"to": "b", "amount": 6}),
                                    tool_call("pay", {"to": "c", "amount": 7})], [text("done")]])
    r = await agent.invoke(session_id="ses_h", messages=[user_message("pay")])
    a, b, c = (p.call_id for p in r.approvals)
    awaiting_t = await agent.transcript("ses_h")
    await agent.approve("ses_h", a, input={"to": "fixed", "amount": 5})
    await agent.deny("ses_h", b, reason=XSS)
    decided_t = await agent.transcript("ses_h")
    await agent.approve("ses_h", c)
    await agent.invoke(mode="resume", session_id="ses_h")
    return r, awaiting_t, decided_t, await agent.transcript("ses_h")


async def test_awaiting_approved_and_denied_read_with_the_weight_of_other_outcomes():
    result, awaiting_t, decided_t, final_t = await _decided_transcript()
    html = awaiting_t._repr_html_()
    assert html.count("class='we0-badge we0-s-awaiting'") == 3 and html.count(">awaiting approval<") == 3
    assert "why: pay requires approval for every call" in html and "<img" not in html
    assert "data-approval='requested'" in html
    # decided, not yet resumed: the decision shows as a badge next to the status
    html = decided_t._repr_html_()
    assert "we0-o-approved" in html and ">approved, edited<" in html and "a resume runs it" in html
    # the corrected arguments are named before a resume runs them (the input column shows the model's)
    fixed = esc(json.dumps({"amount": 5, "to": "fixed"}, ensure_ascii=False, sort_keys=True))
    assert re.search(f"arguments corrected by a person to <span class='we0-mono'[^>]*>{re.escape(fixed)}</span>", html)
    assert "we0-o-denied" in html and f"denied: {esc(XSS)}" in html and "a resume tells the model" in html
    assert "<img" not in html
    # resumed: the denial is the call's final status, the approval a badge
    html = final_t._repr_html_()
    assert ">denied<" in html and "we0-s-denied" in html and ">approved, edited<" in html and ">approved<" in html
    assert "; the model asked for <span class='we0-mono'" in html
    assert esc(json.dumps({"amount": 5, "to": XSS}, ensure_ascii=False, sort_keys=True)) in html
    # badges carry inline styles that survive sanitising, of the same size as the others
    from we0nb.notebook.styles import INLINE

    for cls in ("we0-s-awaiting", "we0-s-denied", "we0-o-approved", "we0-o-denied"):
        assert "background-color:" in INLINE[cls]
    for needle in ("class='we0-badge we0-s-denied' style='display:inline-block;padding:0 6px",
                   "class='we0-badge we0-o-approved' style='display:inline-block;padding:0 6px"):
        assert needle in html
    plain = final_t._repr_mimebundle_()["text/plain"]
    assert 'tool pay({"amount": 5, "to": "fixed"}) completed [approved, arguments corrected]' in plain
    assert "tool pay({\"amount\": 6, \"to\": \"b\"}) denied -> 'Denied by a person: " in plain
    assert 'tool pay({"amount": 7, "to": "c"}) completed [approved]' in plain
    plain = awaiting_t._repr_mimebundle_()["text/plain"]
    assert plain.count("awaiting approval (why: pay requires approval for every call)") == 3
    # the RunResult says what waits
    assert "we0-s-awaiting" in render_html(result) and "<img" not in render_html(result)
    assert render_text(result).splitlines()[1].startswith("  awaiting: tool pay(")


async def test_show_renders_an_approval_run_and_says_how_to_decide():
    import we0nb

    agent = make_agent([])
    h = Handle()
    result = await we0nb.show(agent, "pay", session_id="ses_show", handle=h)
    assert result.result == "approval"
    final = h.bundles[-1]
    assert "data-status='approval'" in final["text/html"] and "we0nb approve" in final["text/html"]
    assert "we0-s-awaiting" in final["text/html"] and "<img" not in final["text/html"]
    assert "2 calls await a person's decision" in final["text/plain"]


async def test_an_edit_renews_its_box_only():
    """Each edit received replaces the text box by a fresh one (the widgets' front end sends a box's
    next edit only after an idle a busy kernel never reports); the buttons are never re-rendered."""
    agent = make_agent([])
    panel, _ = panel_for(agent)
    panel.start("pay")
    await panel.wait()
    row = panel.approvals.rows[0]
    children, buttons, old_args, old_reason = row.widget.children, row._buttons.children, row.args, row.reason
    assert old_args.continuous_update is False and old_reason.continuous_update is False  # sent when it loses focus
    old_args.value = '{"to": "x", "amount": 1}'
    await until(lambda: row.args is not old_args)
    assert row.args.value == '{"to": "x", "amount": 1}' and row.args.model_id != old_args.model_id
    assert row.widget.children == children and row._buttons.children == buttons  # same widgets: same views
    assert row._holders["args"].children == (row.args,)
    old_reason.value = "no"
    await until(lambda: row.reason is not old_reason)
    assert row.reason.value == "no" and row._holders["reason"].children == (row.reason,)
    old_args.value = "ignored"  # a retired box no longer counts
    row.approve_button.click()
    await until(lambda: row.decision == "approved")
    t = await agent.transcript("ses_ap")
    assert t.messages[1].tool_parts[0].approval_detail.input == {"to": "x", "amount": 1}


async def test_the_saved_text_of_the_panels_widgets_follows_a_run_that_ends_by_itself(monkeypatch):
    """Where widgets cannot render (a saved notebook opened elsewhere, untrusted) the panel's
    output shows its text/plain: it must say how the run ended once it ends — also when no later
    cell awaits the run — and in every display of the panel, not only the last."""
    import IPython.display

    from we0nb.notebook import panel as panel_module

    shown: list[Handle] = []

    class WidgetHandle(Handle):
        def update(self, bundle, raw=False):
            self.bundles.append(bundle)

    def display(bundle, raw=False, display_id=None):
        shown.append(WidgetHandle())
        shown[-1].bundles.append(bundle)
        return shown[-1]

    monkeypatch.setattr(panel_module, "_in_kernel", lambda: True)
    monkeypatch.setattr(IPython.display, "display", display)
    agent = We0Agent(ScriptedModel([[text("A long answer.")]], delay=0.01))
    panel = RunPanel(agent, session_id="ses_saved", display=lambda b: Handle())
    panel._ipython_display_()
    panel._ipython_display_()  # (displayed twice: both outputs are saved)
    widgets = [h for h in shown if "status:" in h.bundles[0].get("text/plain", "")]
    assert len(widgets) == 2
    panel.start("Write a long answer")
    await until(lambda: panel._task is not None and panel._task.done())
    await asyncio.sleep(0)
    for h in widgets:
        assert h.bundles[-1]["text/plain"].startswith("status: finished · session ses_saved"), h.bundles[-1]
