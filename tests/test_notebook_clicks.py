"""A tutorial runs on whichever way the reader took (issue 36): where 06 invites Approve / Deny and
08 shows an Abort button, the clicks are made in the kernel as a person would (the buttons'
``click()``, what a front end's click message runs), then the remaining cells must run without
an error and tell the truth. (The scripted path is the saved run, compared by nbval.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")

from nbutil_kernel import execute_notebook  # noqa: E402
pytest.importorskip("ipywidgets")

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"


def _run_with(name: str, tmp_path: Path, before: str, cell: str) -> list:
    """Execute notebook ``name`` with ``cell`` inserted before the first cell whose source starts
    with ``before``; the code cells, executed."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    at = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.source.startswith(before))
    nb.cells.insert(at, nbformat.v4.new_code_cell(cell))
    execute_notebook(nb, tmp_path, timeout=180)
    code = [c for c in nb.cells if c.cell_type == "code"]
    errors = [(c.source[:60], o.get("ename"), o.get("evalue")) for c in code for o in c.outputs
              if o.output_type == "error"]
    assert not errors, errors
    return code


def _printed(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


@pytest.mark.kernel
def test_06_approve_and_deny_by_hand_then_the_rest_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    clicks = '''import asyncio
await panel.check()  # (the rows are shown)
first, second = panel.approvals.rows
first.args.value = '{"number": "INV-2", "amount": 4500}'  # the amount corrected in the text box
first.approve_button.click()
second.reason.value = "duplicate of INV-1"
second.deny_button.click()
await asyncio.sleep(1)  # a person reads the panel before running the next cell'''
    code = _run_with("06-approvals.ipynb", tmp_path, "# NBVAL_CHECK_OUTPUT\nawait panel.check()", clicks)
    out = {c.source.split("\n")[1][:40]: _printed(c) for c in code if c.source.startswith("# NBVAL_CHECK_OUTPUT\n")}
    decided = [text for text in out.values() if "already decided in the panel above" in text]
    assert len(decided) == 2, out  # the refusal cell and the approve cell both say why they skip
    final = next(text for text in out.values() if text.startswith("stop |"))
    assert "INV-3 was not paid" in final
    log = next(text for text in out.values() if "| by the child" in text)
    assert log.splitlines() == ["paid INV-1 amount=120 | by the child", "paid INV-2 amount=4500 | by this notebook"]


@pytest.mark.kernel
def test_08_abort_clicked_during_the_continuation_then_the_rest_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    clicker = '''from ipywidgets import Button
from ipywidgets.widgets.widget import _instances


async def click_abort_after(more: int) -> None:
    """A person clicks the Abort button of the batch that runs, once `more` labels are saved."""
    start = len(LEDGER.read_text().splitlines())
    while len(LEDGER.read_text().splitlines()) < start + more:
        await asyncio.sleep(0.005)
    live = [w for w in list(_instances.values()) if isinstance(w, Button) and w.description == "Abort"
            and not w.disabled]
    live[-1].click()
    hand_clicks.append(len(LEDGER.read_text().splitlines()))


hand_clicks = []
hand = asyncio.create_task(click_abort_after(30))'''
    code = _run_with("08-batch.ipynb", tmp_path, "second = await agent.batch(", clicker + "\n")
    cont = next(c for c in code if c.source.startswith("second = await agent.batch("))
    views = [o["data"]["text/plain"] for o in cont.outputs if "application/vnd.jupyter.widget-view+json"
             in o.get("data", {})]
    assert len(views) >= 2 and "aborted" in views[0] and "finished · 200/200 ended" in views[-1], views
    checks = next(_printed(c) for c in code if "labels only for items that ended" in c.source)
    assert "no label saved twice: True" in checks and "labels only for items that ended: True" in checks, checks
