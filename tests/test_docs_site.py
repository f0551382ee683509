"""The documentation site builds with ``mkdocs build --strict``: a broken link or anchor, a page
missing from the nav, or an API name whose docstring cannot be read fails the build."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (pip install -e '.[docs]')")
    pytest.importorskip("material", reason="mkdocs-material is not installed (pip install -e '.[docs]')")
    pytest.importorskip("mkdocstrings_handlers.python",
                        reason="mkdocstrings-python is not installed (pip install -e '.[docs]')")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    site = tmp_path / "site"
    for name in ("index.html", "resume/index.html", "api/agent/index.html", "architecture/index.html"):
        assert (site / name).exists(), name
    # the API reference is generated from the docstrings, not left empty
    assert "An LLM agent whose every message and part is persisted" in (site / "api/agent/index.html").read_text()
    # nothing is loaded from the network: no web fonts, the architecture picture is an SVG file
    for page in site.rglob("*.html"):
        html = page.read_text()
        assert not re.search(r'<(script|img)[^>]*src="https?:', html), f"{page}: a script or image from the network"
        assert not re.search(r'<link[^>]*rel="stylesheet"[^>]*href="https?:', html), f"{page}: a stylesheet from the network"
        assert "fonts.googleapis.com" not in html, f"{page}: web fonts"
    assert (site / "img" / "architecture.svg").exists()

