"""``we0nb lab``: open the tutorial notebooks in JupyterLab; every other argument goes to jupyter lab."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

from ._common import EXIT_INTERRUPTED, CliError, hint, say

__all__ = ["cmd_lab", "lab_command", "notebooks_dir", "add_parsers"]


def notebooks_dir() -> Optional[Path]:
    here = Path(__file__).resolve().parent.parent.parent
    for cand in (Path.cwd() / "notebooks", here / "notebooks"):
        if (cand / "01-quickstart.ipynb").exists():
            return cand
    return None


def _is_root() -> bool:
    geteuid = getattr(os, "geteuid", None)
    return geteuid is not None and geteuid() == 0


def lab_command(where: Path, extra: list[str]) -> list[str]:
    """``python -m jupyter lab DIR …``; ``--allow-root`` added when running as root (Jupyter refuses root without it)."""
    if extra and extra[0] == "--":
        extra = extra[1:]
    root = ["--allow-root"] if _is_root() and "--allow-root" not in extra else []
    return [sys.executable, "-m", "jupyter", "lab", str(where), *root, *extra]


def cmd_lab(args: argparse.Namespace) -> int:
    where = Path(args.dir) if args.dir else notebooks_dir()
    if where is None or not where.is_dir():
        raise CliError("cannot find the notebooks/ folder (it is in the source repository, not in the wheel). "
                       "Run `we0nb lab` from a clone of the repository, or pass --dir PATH.")
    cmd = lab_command(where, list(args.jupyter_args))
    if args.dry_run:
        say(hint(*cmd))
        return 0
    try:
        import jupyterlab  # noqa: F401
    except ImportError:
        raise CliError('JupyterLab is not installed: pip install jupyterlab (we0nb itself brings the kernel, '
                       'ipywidgets, pandas and matplotlib).') from None
    try:
        return subprocess.call(cmd)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def add_parsers(sub: Any, db: argparse.ArgumentParser, common: argparse.ArgumentParser) -> dict[str, Any]:
    lab = sub.add_parser(
        "lab", parents=[common], allow_abbrev=False, help="open the tutorial notebooks in JupyterLab",
        usage="we0nb lab [-h] [--dir DIR] [--dry-run] [--debug] [JUPYTER LAB OPTIONS ...]",
        description="Run `jupyter lab notebooks/`. Every option this command does not know goes to jupyter lab "
                    "(e.g. `we0nb lab --no-browser --port 8890`; after `--`, everything does). As root, "
                    "--allow-root is added. JupyterLab itself is not a dependency: pip install jupyterlab.")
    lab.add_argument("--dir", help="notebook folder (default: ./notebooks or the repository's notebooks/)")
    lab.add_argument("--dry-run", action="store_true", help="print the command instead of running it")
    lab.set_defaults(run=cmd_lab, jupyter_args=[])
    return {"lab": lab}
