"""Abort while another cell awaits, on ipykernel 6 (its own venv, see kernel_venvs) and on the
main environment's ipykernel 7; the abort latency counts from the click; the saved widget state.

The click is the message JupyterLab sends (``comm_msg`` ``{"method": "custom", "content":
{"event": "click"}}`` on the button's comm id, main shell channel).
"""

from __future__ import annotations

import time

import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("jupyter_client")

from kernel_venvs import write_kernelspec  # noqa: E402
from nbutil_kernel import Kernel  # noqa: E402

pytestmark = pytest.mark.kernel

SETUP = """
import asyncio, time, we0nb
from we0nb import We0Agent, ScriptedModel, text, tool, tool_call
from we0nb.notebook import RunPanel

ORDERS = []

@tool
def order_tea(quantity: int) -> str:
    ORDERS.append(quantity)
    return "ordered"

agent = We0Agent(ScriptedModel([
    [text([f"w{i} " for i in range(3000)]), tool_call("order_tea", {"quantity": 1})],
    [text("done")],
], delay=0.005), tools=[order_tea])
panel = RunPanel(agent, session_id="ses_v")
panel.start("go")
print(panel.abort_button.model_id)
"""


@pytest.fixture(params=["6.29.5", "6.31.0", "7.0.1", "main"],
                ids=["ipykernel-6.29.5", "ipykernel-6.31.0", "ipykernel-7.0.1", "ipykernel-main"])
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


def _streaming(k: Kernel, word: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not any(m["msg_type"] == "update_display_data" and word in m["content"]["data"].get("text/html", "")
                  for m in k.iopub):
        assert time.monotonic() < deadline, f"no {word!r} streamed"
        k._pump(0.05)


def test_abort_while_the_next_cell_awaits_stops_before_the_side_effect(kernel):
    version = kernel.eval("__import__('ipykernel').__version__")
    setup = kernel.submit(SETUP)
    waiting = kernel.submit("r = await panel.wait()\nprint('joined', panel.status, r, ORDERS)")
    abort_id = kernel.result(setup)["stdout"].split()[0]
    _streaming(kernel, "w50 ")
    # ipykernel 7.0-7.3 handle a click past a running cell only on a kernel subshell, where
    # JupyterLab (4.4 and later) sends widget messages by default: click as it does
    subshell = kernel.create_subshell() if version.startswith(("7.0", "7.1", "7.2", "7.3")) else None
    clicked = time.time()
    kernel.click(abort_id, subshell)
    r = kernel.result(waiting, timeout=60)
    seen = time.time()
    assert r["reply"]["status"] == "ok"
    assert r["stdout"].strip() == "joined aborted None []", (version, r["stdout"])  # order_tea never ran
    latency = kernel.eval("panel.last_abort_latency")
    assert 0 <= latency <= seen - clicked + 0.5, (latency, seen - clicked)
    threads = kernel.eval("panel.click_threads")
    if version.startswith("6."):
        assert threads == ["MainThread (on arrival)"], threads  # handled as the message arrived
    assert kernel.eval("len(panel.click_threads)") == 1  # the queued copy of the click did nothing more


def test_abort_latency_counts_from_the_click_behind_a_blocking_cell(kernel):
    setup = kernel.submit(SETUP)
    abort_id = kernel.result(setup)["stdout"].split()[0]
    _streaming(kernel, "w20 ")
    blocking = kernel.submit("time.sleep(2); unblocked = time.time()")
    deadline = time.monotonic() + 60
    while not any(m["msg_type"] == "execute_input" and m["parent_header"].get("msg_id") == blocking
                  for m in kernel.iopub):
        assert time.monotonic() < deadline
        kernel._pump(0.05)
    clicked = time.time()
    kernel.click(abort_id)
    kernel.result(blocking, timeout=60)
    kernel.wait_for("panel.status == 'aborted'", 60, "the aborted status")
    latency = kernel.eval("panel.last_abort_latency")
    unblocked = kernel.eval("unblocked")
    # the run could not stop before the blocking cell let the loop go: the latency says so
    assert latency >= unblocked - clicked - 0.05, (latency, unblocked - clicked)
    assert kernel.eval("ORDERS") == []
