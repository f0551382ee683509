"""``we0nb lab``: open the tutorial notebooks in JupyterLab; every other argument goes to jupyter lab.

From a clone, the repository's ``notebooks/`` opens. The tutorials also ship with the wheel (in
``share/we0nb/notebooks`` under the environment): ``we0nb lab --dir DIR`` copies them to DIR
(never over a file already there: your edits stay) and opens it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import site
import sys
import sysconfig
from pathlib import Path
from typing import Any, Optional

from ._common import EXIT_INTERRUPTED, CliError, hint, say

__all__ = ["cmd_lab", "lab_command", "notebooks_dir", "shipped_tutorials", "copy_tutorials", "add_parsers"]


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


def shipped_tutorials() -> Optional[Path]:
    """The tutorials installed with the wheel (``share/we0nb/notebooks`` of the environment), if any."""
    bases = [sysconfig.get_path("data"), sys.prefix, getattr(site, "USER_BASE", None)]
    for base in bases:
        cand = Path(base) / "share" / "we0nb" / "notebooks" if base else None
        if cand is not None and (cand / "01-quickstart.ipynb").exists():
            return cand
    return None


#: what a tutorial reads besides the notebooks (tutorial 10 replays a recorded session)
TUTORIAL_DATA = ("data/local-recording.db",)


def copy_tutorials(source: Path, target: Path) -> int:
    """Copy the tutorials (their README and the data they read) from ``source`` into ``target``; a
    file already there is kept (the reader's edits). How many files were copied."""
    target.mkdir(parents=True, exist_ok=True)
    files = [f for f in sorted(source.iterdir()) if f.suffix == ".ipynb" or f.name == "README.md"]
    files += [source / name for name in TUTORIAL_DATA if (source / name).is_file()]
    copied = 0
    for f in files:
        dest = target / f.relative_to(source)
        if not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, dest)
            copied += 1
    return copied


def _where(args: argparse.Namespace) -> Path:
    """The folder to open: ``--dir`` (the tutorials copied into it when it has no notebook, or the ones
    it lacks when it holds the tutorials already: an upgrade brings new ones), else the repository's
    ``notebooks/``."""
    source = notebooks_dir() or shipped_tutorials()
    if not args.dir:
        if notebooks_dir() is not None:
            return notebooks_dir()  # type: ignore[return-value]
        if source is not None:
            raise CliError("name a folder to copy the tutorials to, then they open from there: "
                           "we0nb lab --dir ~/we0nb-tutorials")
        raise CliError("cannot find the tutorials (neither a notebooks/ folder here nor the copy installed with "
                       "we0nb). Run `we0nb lab` from a clone of the repository, or pass --dir PATH.")
    where = Path(args.dir).expanduser()
    if where.exists() and not where.is_dir():
        raise CliError(f"--dir must be a folder; {where} is a file. Name a folder (it is made if missing).")
    if where.is_dir() and any(where.glob("*.ipynb")) and not (where / "01-quickstart.ipynb").exists():
        return where  # a folder of the user's own notebooks: opened as it is
    if source is not None and where.resolve() == source.resolve():
        return where
    if source is None:
        raise CliError(f"{where} holds no notebook, and the tutorials to copy there cannot be found "
                       "(reinstall we0nb, or run from a clone of the repository).")
    if args.dry_run:
        say(f"Would copy the tutorials of {source} to {where}.")
        return where
    n = copy_tutorials(source, where)
    say(f"Copied {n} tutorial file{'s' * (n != 1)} to {where}.")
    return where


def cmd_lab(args: argparse.Namespace) -> int:
    if not args.dry_run:  # (before anything is copied: nothing would open it)
        try:
            import jupyterlab  # noqa: F401
        except ImportError:
            raise CliError('JupyterLab is not installed: pip install jupyterlab (we0nb itself brings the kernel, '
                           'ipywidgets, pandas and matplotlib).') from None
    where = _where(args)
    cmd = lab_command(where, list(args.jupyter_args))
    if args.dry_run:
        say(hint(*cmd))
        return 0
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
    lab.add_argument("--dir", help="notebook folder (default: ./notebooks or the repository's notebooks/); "
                                   "a folder without notebooks gets a copy of the tutorials first")
    lab.add_argument("--dry-run", action="store_true", help="print the command instead of running it")
    lab.set_defaults(run=cmd_lab, jupyter_args=[])
    return {"lab": lab}
