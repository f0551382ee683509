"""notebooks/07-mcp.ipynb on a base install (no ``mcp`` extra): it runs to the end, and each cell
that needs the MCP SDK says why it is skipped instead of failing (issue 36). With the extra,
nbval runs it for real (see pyproject's addopts)."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")

from nbutil_kernel import execute_notebook  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "07-mcp.ipynb"

# a sitecustomize that makes the MCP SDK look uninstalled in the kernel
HIDE = textwrap.dedent("""
    import importlib.abc, sys

    class _Hide(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "mcp":
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, _Hide())
""")


@pytest.mark.kernel
def test_notebook_07_skips_each_cell_with_its_reason_without_the_mcp_extra(tmp_path, monkeypatch):
    (tmp_path / "sitecustomize.py").write_text(HIDE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    execute_notebook(nb, tmp_path)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert not [o for c in code for o in c.outputs if o.output_type == "error"]
    guard = next(i for i, c in enumerate(code) if "import mcp" in c.source)
    said = "".join(o.get("text", "") for o in code[guard].outputs)
    assert "The cells below are skipped" in said and 'pip install "we0nb[mcp]"' in said
    for cell in code[guard + 1:]:  # each one says so, visibly
        text = "".join(o.get("text", "") for o in cell.outputs)
        assert text.startswith("skipped: this cell needs the MCP SDK"), (cell.source[:60], text)
