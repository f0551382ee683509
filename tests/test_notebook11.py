"""notebooks/11-tracing-and-cost.ipynb on a base install: without OpenTelemetry its tracing
cells say why they are skipped and its cost cells still run. (With it, nbval runs the whole
notebook; see pyproject's addopts.)"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")

from nbutil_kernel import execute_notebook  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "11-tracing-and-cost.ipynb"

# a sitecustomize that makes OpenTelemetry look uninstalled in the kernel
HIDE = textwrap.dedent("""
    import importlib.abc, sys

    class _Hide(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "opentelemetry":
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, _Hide())
""")


@pytest.mark.kernel
def test_notebook_11_runs_to_the_end_without_opentelemetry(tmp_path, monkeypatch):
    (tmp_path / "sitecustomize.py").write_text(HIDE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    execute_notebook(nb, tmp_path)
    texts = ["".join(o.get("text", "")) or "".join(o.get("data", {}).get("text/plain", ""))
             for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    text = "\n".join(texts)
    assert "The tracing cells below are skipped" in text and 'pip install "we0nb[otel]"' in text
    assert "skipped: the OpenTelemetry SDK is not installed" in text
    assert "invoke_agent" not in text
    # the cost cells ran: a priced run, a batch's cost frame, a budget
    assert "the resume cost: $" in text and "batch cost: $" in text and "stopped: max_cost" in text
