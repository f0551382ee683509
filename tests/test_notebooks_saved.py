"""The tutorial notebooks are saved executed, so they read well on GitHub and nbval has outputs to compare.

nbval itself runs the notebooks (``pytest notebooks/ --nbval-lax ...``); it silently compares
nothing for a cell saved without being run, so these checks keep the saved state honest.
"""

from __future__ import annotations

import configparser
import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
EXPECTED = ["01-quickstart.ipynb", "02-abort-and-resume.ipynb", "03-durable-sessions.ipynb",
            "04-dataframes.ipynb", "05-real-models.ipynb", "06-approvals.ipynb", "07-mcp.ipynb",
            "08-batch.ipynb", "09-exactly-once.ipynb", "10-experiments.ipynb", "11-tracing-and-cost.ipynb"]


def _notebooks():
    return sorted(NOTEBOOKS.glob("*.ipynb"))


def test_the_tutorials_exist():
    assert [p.name for p in _notebooks()] == EXPECTED


@pytest.mark.parametrize("path", _notebooks(), ids=lambda p: p.name)
def test_saved_executed_top_to_bottom(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3"
    counts = []
    checked = 0
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        tags = cell.metadata.get("tags", [])
        skipped = "# NBVAL_SKIP" in cell.source
        # cells that need a server are skipped by nbval and by nbclient/nbconvert alike
        assert skipped == ("skip-execution" in tags), f"cell {i}: # NBVAL_SKIP and the skip-execution tag go together"
        if skipped:
            assert not cell.outputs, f"cell {i} needs a server; it must be saved without outputs"
            continue
        assert cell.execution_count is not None, f"cell {i} was saved without being run"
        counts.append(cell.execution_count)
        for out in cell.outputs:
            assert out.output_type != "error", f"cell {i} was saved with an error: {out.get('ename')}"
            text = "".join(out.get("text", "")) if out.output_type == "stream" else ""
            assert "Traceback" not in text, f"cell {i} printed a traceback"
        if "# NBVAL_CHECK_OUTPUT" in cell.source:
            checked += 1
            assert cell.outputs, f"cell {i} is checked by nbval but has no saved output"
    assert counts == list(range(1, len(counts) + 1)), f"not run top to bottom in one kernel: {counts}"
    assert checked >= 1, "no cell is marked # NBVAL_CHECK_OUTPUT"


def test_sanitize_file():
    text = (NOTEBOOKS / "sanitize.cfg").read_text()
    cfg = configparser.ConfigParser()
    cfg.read_string(text)
    assert cfg.sections()
    for name in cfg.sections():
        assert set(cfg[name]) == {"regex", "replace"}, name
        re.compile(cfg[name]["regex"])
    subs = [(re.compile(cfg[s]["regex"]), cfg[s]["replace"]) for s in cfg.sections()]

    def clean(s: str) -> str:
        for rx, rep in subs:
            s = rx.sub(rep, s)
        return s

    a = "ses_0661a8073271fe0d026086e6 call_0661a82e21bab1c911a02f3c 2026-12-02 15:19:10.782570+00:00 0.61s <obj at 0x7f3a2c1d9e80> 0 days 00:00:00.051093 pid=4242"
    b = "ses_0661a8073271aaaaaaaaaaaa call_0661a82e21babbbbbbbbbbbb 2027-01-01 01:02:03.000001+00:00 1.20s <obj at 0x7f00000000aa> 0 days 00:00:01.000000 pid=17"
    assert clean(a) == clean(b)
    # what must survive: fixed session ids, counts, and words
    assert clean("ses_quickstart 14 in stock, 2 x coffee") == "ses_quickstart 14 in stock, 2 x coffee"
