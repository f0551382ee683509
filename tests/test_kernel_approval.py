"""Real kernels: the Approve / Deny buttons of the run panel, clicked with the comm messages a front
end sends — while another cell runs (on ipykernel 6 through the on-arrival path, on 7.0 through a
kernel subshell, on the main environment's 7.x as it comes), after a kernel restart (a panel
rebuilt on the SQLite store), from ``we0nb.show(agent, …)`` and from ``%%we0``.

An edit of the arguments is the ``update`` message a front end sends for the text box
(``{"method": "update", "state": {"value": …}}``), a click the ``custom`` click message.
"""

from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("jupyter_client")

from kernel_venvs import write_kernelspec  # noqa: E402
from nbutil_kernel import Kernel  # noqa: E402

pytestmark = pytest.mark.kernel

AGENT = """
import asyncio, json, threading, we0nb
from we0nb import We0Agent, ScriptedModel, SqlPersistence, text, tool, tool_call
from we0nb.notebook import RunPanel

PAID = []

@tool(requires_approval=True)
def pay(to: str, amount: int) -> str:
    PAID.append((to, amount))
    return f"paid {amount} to {to}"

FIRST = [text("Paying."), tool_call("pay", {"to": "ann", "amount": 5}), tool_call("pay", {"to": "bob", "amount": 6})]
ANSWER = [text("One paid, one denied.")]

def build(steps):
    return We0Agent(ScriptedModel(steps), tools=[pay], persistence=SqlPersistence(DB))
"""

START = """
agent = build([FIRST, ANSWER])
panel = RunPanel(agent, session_id="ses_kap")
panel.start("pay ann and bob")
r1 = await panel.wait()
print(json.dumps({"result": r1.result, "rows": [[r.call_id, r.args.model_id, r.reason.model_id,
      r.approve_button.model_id, r.deny_button.model_id] for r in panel.approvals.rows]}))
"""

JOIN = """
r = await panel.wait(decisions=True)
print("joined", r.result, r.text, PAID, panel.status)
"""


def _rows(out: str) -> list[list[str]]:
    data = json.loads(out.strip().splitlines()[-1])
    assert data["result"] == "approval", data
    return data["rows"]


def _decide(k: Kernel, rows, subshell_id=None) -> None:
    """Correct the first call's arguments and approve it; deny the second with a reason."""
    (_, args1, _, approve1, _), (_, _, reason2, _, deny2) = rows
    k.update_widget(args1, {"value": json.dumps({"to": "ann", "amount": 50})}, subshell_id)
    k.click(approve1, subshell_id)
    k.update_widget(reason2, {"value": "not <bob>"}, subshell_id)
    k.click(deny2, subshell_id)


def _pump_until(k: Kernel, found, what: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while True:
        got = found()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        k._pump(0.05)


def _decide_as_a_front_end_does(k: Kernel, rows, subshell_id=None) -> None:
    """Bad JSON first (the row says so), then the corrected arguments — sent, as a front end
    does, to the fresh text box the kernel opened after the first edit — then Approve; a reason
    and Deny on the second call."""
    (_, args1, _, approve1, _), (_, _, reason2, _, deny2) = rows
    bad = '{"to": "ann", "amount": '
    start = len(k.iopub)
    k.update_widget(args1, {"value": bad}, subshell_id)
    k.click(approve1, subshell_id)
    _pump_until(k, lambda: any(m["msg_type"] == "comm_msg" and "not valid JSON" in json.dumps(m["content"])
                               for m in k.iopub[start:]), "the row to say the JSON is not valid")

    def fresh_box():
        opened = [m["content"] for m in k.iopub[start:] if m["msg_type"] == "comm_open"
                  and m["content"]["data"]["state"].get("_model_name") == "TextareaModel"]
        return [c["comm_id"] for c in opened if c["data"]["state"].get("value") == bad]

    (args1_fresh,) = _pump_until(k, fresh_box, "the fresh arguments box")
    k.update_widget(args1_fresh, {"value": json.dumps({"to": "ann", "amount": 50})}, subshell_id)
    k.click(approve1, subshell_id)
    k.update_widget(reason2, {"value": "not <bob>"}, subshell_id)
    k.click(deny2, subshell_id)


def _check_store(k: Kernel) -> None:
    k.run("t = await agent.transcript('ses_kap'); paid, denied = t.messages[1].tool_parts")
    assert k.eval("[paid.state.input, paid.state.metadata['original_input'], paid.approval]") == [
        {"to": "ann", "amount": 50}, {"to": "ann", "amount": 5}, "approved"]
    assert k.eval("[denied.approval, denied.state.metadata['denied'], denied.state.metadata['reason']]") == [
        "denied", True, "not <bob>"]


@pytest.fixture(params=["6.29.5", "7.0.1", "main"], ids=["ipykernel-6.29.5", "ipykernel-7.0.1", "ipykernel-main"])
def kernel(tmp_path, request):
    if request.param == "main":
        k = Kernel(cwd=str(tmp_path))
    else:
        data = tmp_path / "jupyter-data"
        name = write_kernelspec(data, request.param)
        k = Kernel(cwd=str(tmp_path), kernel_name=name, kernel_dirs=[str(data / "kernels")])
    try:
        yield k
    finally:
        k.shutdown()


def test_approve_and_deny_clicked_while_the_next_cell_awaits(kernel, tmp_path):
    """Run All: the cell after the panel waits for the decisions (``wait(decisions=True)``); the
    clicks — an edit of the arguments, Approve, a reason, Deny — reach the panel meanwhile,
    record the decisions and resume the run, and that cell returns with the run's end."""
    version = kernel.eval("__import__('ipykernel').__version__")
    kernel.run(f"DB = {'sqlite:///' + str(tmp_path / 'k.db')!r}\n" + AGENT)
    rows = _rows(kernel.run(START)["stdout"])
    waiting = kernel.submit(JOIN)
    deadline = time.monotonic() + 60  # the joining cell is running (its execute_input went out)
    while not any(m["msg_type"] == "execute_input" and m["parent_header"].get("msg_id") == waiting
                  for m in kernel.iopub):
        assert time.monotonic() < deadline
        kernel._pump(0.05)
    # ipykernel 7.0-7.3 handle comm messages past a running cell only on a kernel subshell
    # (JupyterLab 4.4+ sends them there by default): send them as it does
    subshell = kernel.create_subshell() if version.startswith(("7.0", "7.1", "7.2", "7.3")) else None
    _decide_as_a_front_end_does(kernel, rows, subshell)
    r = kernel.result(waiting, timeout=90)
    assert r["reply"]["status"] == "ok", r
    assert r["stdout"].strip() == "joined stop One paid, one denied. [('ann', 50)] finished", (version, r["stdout"])
    _check_store(kernel)
    threads = kernel.eval("panel.approvals.click_threads")
    assert len(threads) == 3, threads  # each click handled once (the queued copies did nothing more)
    if version.startswith("6."):
        assert threads == ["MainThread (on arrival)"] * 3, threads  # handled as the messages arrived


def test_a_kernel_restart_between_request_and_decision(tmp_path):
    """The request is made in one kernel, which is then shut down; a new kernel rebuilds the agent
    and the panel on the SQLite store, finds the awaiting calls and takes the clicks."""
    db = f"sqlite:///{tmp_path / 'restart.db'}"
    first = Kernel(cwd=str(tmp_path))
    try:
        first.run(f"DB = {db!r}\n" + AGENT)
        _rows(first.run(START)["stdout"])
        assert first.eval("PAID") == []
    finally:
        first.shutdown()
    k = Kernel(cwd=str(tmp_path))
    try:
        k.run(f"DB = {db!r}\n" + AGENT + "\nagent = build([ANSWER])\npanel = RunPanel(agent, session_id='ses_kap')\n"
              "panel._ipython_display_()")
        k.wait_for("panel.status == 'awaiting approval'", 60, "the panel to find the awaiting calls")
        rows = k.eval("[[r.call_id, r.args.model_id, r.reason.model_id, r.approve_button.model_id, "
                      "r.deny_button.model_id] for r in panel.approvals.rows]")
        k.run("t0 = await agent.transcript('ses_kap')")
        assert [row[0] for row in rows] == k.eval("[p.call_id for p in t0.pending_approvals]")
        _decide(k, rows)
        k.wait_for("panel.status == 'finished'", 60, "the resumed run to finish")
        assert k.eval("[panel.result.text, PAID]") == ["One paid, one denied.", [["ann", 50]]]
        _check_store(k)
        final = k.eval("panel.view.bundle(final=True)['text/plain']")
        assert "[approved, arguments corrected]" in final and "One paid, one denied." in final
    finally:
        k.shutdown()


@pytest.fixture
def main_kernel(tmp_path):
    k = Kernel(cwd=str(tmp_path))
    try:
        yield k
    finally:
        k.shutdown()


def test_show_with_an_agent_puts_the_buttons_below_its_view(main_kernel, tmp_path):
    k = main_kernel
    k.run(f"DB = {'sqlite:///' + str(tmp_path / 's.db')!r}\n" + AGENT + "\nagent = build([FIRST, ANSWER])")
    r = k.run("res = await we0nb.show(agent, 'pay ann and bob', session_id='ses_kap')\n"
              "from we0nb.notebook.panel import _panels\n"
              "shown = [p for p in _panels if p.session_id == 'ses_kap']")
    bundles = [m["content"]["data"] for m in r["msgs"] if m["msg_type"] == "display_data"]
    assert any("we0-live" in b.get("text/html", "") for b in bundles)  # the view
    widget = [b for b in bundles if "application/vnd.jupyter.widget-view+json" in b]
    assert len(widget) == 1 and widget[0]["text/plain"].startswith("status: awaiting approval · session ses_kap")
    assert k.eval("[res.result, len(shown)]") == ["approval", 1]
    k.run("panel = shown[0]")
    assert k.eval("panel.view is not None and panel.view.status") == "approval"
    rows = k.eval("[[r.call_id, r.args.model_id, r.reason.model_id, r.approve_button.model_id, "
                  "r.deny_button.model_id] for r in panel.approvals.rows]")
    _decide(k, rows)
    k.wait_for("panel.status == 'finished'", 60, "the resumed run to finish")
    _check_store(k)
    # the resumed run went to the view show() displayed: one display id for both runs
    ids = {m["content"].get("transient", {}).get("display_id") for m in k.iopub
           if m["msg_type"] in ("display_data", "update_display_data")
           and "we0-live" in m["content"]["data"].get("text/html", "")}
    assert len(ids) == 1
    last = [m for m in k.iopub if m["msg_type"] == "update_display_data"
            and "we0-live" in m["content"]["data"].get("text/html", "")][-1]
    assert "One paid, one denied." in last["content"]["data"]["text/plain"]


def test_the_cell_magic_shows_the_rows(main_kernel, tmp_path):
    k = main_kernel
    k.run(f"DB = {'sqlite:///' + str(tmp_path / 'm.db')!r}\n" + AGENT + "\nagent = build([FIRST, ANSWER])\n%load_ext we0nb")
    k.run("%%we0 --session ses_kap\npay ann and bob")
    k.run("r1 = await we0_panel.wait()")
    assert k.eval("[r1.result, we0_panel.status, len(we0_panel.approvals.rows)]") == ["approval", "awaiting approval", 2]
    # %we0 --resume before deciding runs nothing: the rows stay
    k.run("%we0 --resume\nawait we0_panel.wait()")
    assert k.eval("[we0_panel.status, len(we0_panel.approvals.rows)]") == ["awaiting approval", 2]
    k.run("panel = we0_panel")
    rows = k.eval("[[r.call_id, r.args.model_id, r.reason.model_id, r.approve_button.model_id, "
                  "r.deny_button.model_id] for r in panel.approvals.rows]")
    _decide(k, rows)
    k.wait_for("panel.status == 'finished'", 60, "the resumed run to finish")
    _check_store(k)
