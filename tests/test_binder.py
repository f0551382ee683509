"""The Binder configuration: repo2docker reads binder/ and would build Python 3.11 with we0nb installed.

``jupyter-repo2docker --no-build --debug --no-run .`` needs no Docker: it prints the
Dockerfile it would build, which is checked here.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BINDER = ROOT / "binder"


def _repo2docker() -> list[str]:
    exe = shutil.which("jupyter-repo2docker")
    if exe is None:
        candidate = Path(sys.executable).with_name("jupyter-repo2docker")
        if candidate.exists():
            exe = str(candidate)
    if exe is None:
        pytest.skip("jupyter-repo2docker is not installed (pip install jupyter-repo2docker)")
    return [exe]


def test_binder_files():
    assert (BINDER / "runtime.txt").read_text().strip() == "python-3.11"
    reqs = [line.split("#", 1)[0].strip() for line in (BINDER / "requirements.txt").read_text().splitlines()]
    reqs = [r for r in reqs if r]
    # "." (with extras) installs the repository itself after it is copied into the image
    assert any(r == "." or r.startswith(".[") for r in reqs), reqs
    assert any("notebook" in r for r in reqs if r.startswith(".[")), "the notebook extras are needed"
    post = BINDER / "postBuild"
    if post.exists():
        assert post.stat().st_mode & 0o111, "binder/postBuild must be executable"
    # the badge's target exists
    assert (ROOT / "notebooks" / "01-quickstart.ipynb").exists()


def test_repo2docker_dockerfile():
    cmd = _repo2docker() + ["--no-build", "--debug", "--no-run", "."]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "python=3.11" in out, out[-4000:]
    # local requirements: the whole repository is copied in before pip installs it
    assert 'pip install --no-cache-dir -r "binder/requirements.txt"' in out, out[-4000:]
    assert "COPY" in out and "${REPO_DIR}/" in out
    if (BINDER / "postBuild").exists():
        assert "./binder/postBuild" in out
