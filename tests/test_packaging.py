"""Packaging: the base install is the whole notebook experience, yet ``import we0nb`` stays light."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("ipykernel", "ipywidgets", "IPython", "pandas", "numpy", "matplotlib", "pyarrow", "sqlalchemy",
         "aiosqlite", "greenlet", "psycopg", "openai", "zmq", "tornado", "jupyter_client")


def _imported_after(code: str) -> list[str]:
    probe = code + f"\nimport sys, json\nprint(json.dumps(sorted(m for m in {list(HEAVY)!r} if m in sys.modules)))"
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_import_we0nb_and_the_engine_load_no_notebook_or_database_package():
    assert _imported_after("import we0nb, we0nb.engine") == []
    # the data model, a scripted run in memory and the command line stay light too
    assert _imported_after("import we0nb.cli, we0nb.messages, we0nb.testing, we0nb.notebook") == []


def test_the_base_install_has_the_notebook_packages_and_keeps_the_old_extra():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {d.split(">")[0].split("[")[0].split("=")[0].split("<")[0].strip().lower() for d in meta["dependencies"]}
    assert {"ipykernel", "ipywidgets", "ipython", "pandas", "pyarrow", "matplotlib"} <= names
    assert meta["optional-dependencies"]["notebook"] == []  # an alias: `pip install "we0nb[notebook]"` still works


def test_license_is_an_spdx_expression_with_its_file():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["license"] == "MIT" and meta["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")


def test_the_declared_pythons_are_the_tested_ones():
    """requires-python is what CI runs: the lowest (3.11, the default python) and the highest (3.13)."""
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["requires-python"] == ">=3.11"
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python3.13" in ci and '"$VENV313/bin/python" -m pytest -n 2 --dist loadfile' in ci
    # the README's test command stays the last step, verbatim
    readme = (ROOT / "README.md").read_text()
    command = 'pip install -e ".[test]" && python -m pytest -n 2 --dist loadfile'
    assert command in readme and ci.rstrip().splitlines()[-1] == command
