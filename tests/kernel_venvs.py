"""Kernels of other ipykernel versions for the kernel and browser tests, each in its own venv.

``kernel_python("6.29.5")`` makes (once; kept under ``$WE0NB_KERNEL_VENVS`` or
``/tmp/we0nb-kernels``) a venv with that ipykernel and what the run panel needs, from PyPI;
the kernel imports we0nb from this checkout (``PYTHONPATH``), so it always runs the code
under test. ``write_kernelspec`` registers it in a Jupyter data dir.
``python tests/kernel_venvs.py`` makes them ahead of time (``.ci/run`` does).
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOT = Path(os.environ.get("WE0NB_KERNEL_VENVS", "/tmp/we0nb-kernels"))
#: the ipykernel majors the notebook layer is tested on (the main environment has a 7.x too)
VERSIONS = ("6.29.5", "6.31.0", "7.0.1")
RUNTIME = ["pydantic>=2.6", "typing-extensions>=4.6", "sqlalchemy[asyncio]>=2.0.25", "aiosqlite>=0.19",
           "ipywidgets>=8.1"]


def kernel_python(version: str) -> Path:
    """The python of a venv with ``ipykernel==version`` (created on first use; about a minute)."""
    venv = ROOT / f"ipykernel-{version}"
    python = venv / "bin" / "python"
    ready = venv / ".we0nb-ready"
    if ready.exists():
        return python
    ROOT.mkdir(parents=True, exist_ok=True)
    with open(ROOT / f".lock-{version}", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test process may be making it
        if not ready.exists():
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, timeout=300)
            subprocess.run([str(python), "-m", "pip", "install", "-q", f"ipykernel=={version}", *RUNTIME],
                           check=True, timeout=900)
            ready.write_text(version)
    return python


def write_kernelspec(data_dir: Path, version: str) -> str:
    """Register the ``version`` kernel in ``data_dir/kernels``; returns its kernel name."""
    name = "we0nb-ipykernel-" + version.replace(".", "-")
    spec = data_dir / "kernels" / name
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [str(kernel_python(version)), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"Python (ipykernel {version})",
        "language": "python",
        "env": {"PYTHONPATH": str(REPO)},
    }))
    return name


if __name__ == "__main__":
    for v in VERSIONS:
        print(v, kernel_python(v))
