"""What ``we0nb batch run`` and ``batch work`` are given: the agent (``MODULE:ATTR``) and the prompts file.

``MODULE:ATTR`` names the agent the way uvicorn and celery name an app: a module importable
from the current folder (``myproject.agents``) and an attribute of it (dots go deeper), which
is a :class:`~we0nb.We0Agent` or a function taking no arguments that returns one (async too).
Every mistake is one line saying what was wrong.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Optional

from ._common import CliError

__all__ = ["load_agent", "read_prompts", "PROMPT_SUFFIXES"]

PROMPT_SUFFIXES = (".jsonl", ".csv", ".parquet")


def _split(spec: str) -> tuple[str, str]:
    module, sep, attr = spec.partition(":")
    if not sep or not module.strip() or not attr.strip() or ":" in attr:
        raise CliError(f"the agent {spec!r} is not MODULE:ATTR: name a module and its agent, e.g. "
                       "myproject.agents:agent (a We0Agent, or a function returning one).")
    return module.strip(), attr.strip()


def _import(module: str, spec: str) -> Any:
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m`: modules of the current folder
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is not None and (module == e.name or module.startswith(e.name + ".")):
            raise CliError(f"no module {module!r} (from {spec}): run from the folder that holds it, or put "
                           "its folder on PYTHONPATH.") from None
        raise CliError(f"importing {module!r} (from {spec}) failed: {type(e).__name__}: {e}") from e
    except Exception as e:
        first = (str(e).strip().splitlines() or [""])[0]
        raise CliError(f"importing {module!r} (from {spec}) failed: {type(e).__name__}: {first}") from e


async def load_agent(spec: str) -> Any:
    """The :class:`~we0nb.We0Agent` ``spec`` (``MODULE:ATTR``) names; a function is called for it."""
    from .. import We0Agent

    module, attr = _split(spec)
    value: Any = _import(module, spec)
    for part in attr.split("."):
        if not hasattr(value, part):
            raise CliError(f"{module!r} has no attribute {attr!r} (from {spec}).")
        value = getattr(value, part)
    if not isinstance(value, We0Agent) and callable(value) and not isinstance(value, type):
        try:
            value = value()
            if asyncio.iscoroutine(value):
                value = await value
        except Exception as e:
            first = (str(e).strip().splitlines() or [""])[0]
            raise CliError(f"{spec}() failed: {type(e).__name__}: {first}") from e
    if not isinstance(value, We0Agent):
        what = f"the class {value.__name__}" if isinstance(value, type) else f"a {type(value).__name__}"
        raise CliError(f"{spec} is {what}, not a We0Agent or a function returning one.")
    return value


def read_prompts(path: str, column: Optional[str]) -> list[str]:
    """The prompts of a ``.jsonl`` (one JSON string, or object, a line), ``.csv`` or ``.parquet``
    file: ``column`` of each row (default: the file's only column, or ``prompt``)."""
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in PROMPT_SUFFIXES:
        raise CliError(f"--prompts {path}: expected a .jsonl, .csv or .parquet file.")
    if not p.is_file():
        raise CliError(f"--prompts {path}: no such file.")
    rows = _jsonl(p, column) if suffix == ".jsonl" else _table(p, suffix, column)
    if not rows:
        raise CliError(f"--prompts {path}: the file has no prompts.")
    return rows


def _pick(columns: list[str], column: Optional[str], path: Path) -> str:
    if column is not None:
        if column not in columns:
            raise CliError(f"--column {column!r}: {path} has no such column (columns: {', '.join(columns)}).")
        return column
    if len(columns) == 1:
        return columns[0]
    if "prompt" in columns:
        return "prompt"
    raise CliError(f"--prompts {path} has {len(columns)} columns ({', '.join(columns[:10])}): "
                   "name the prompts' column with --column.")


def _text(value: Any, where: str) -> str:
    if isinstance(value, str) and value.strip():
        return value
    raise CliError(f"{where}: expected the prompt as non-empty text, got {value!r:.60}.")


def _table(p: Path, suffix: str, column: Optional[str]) -> list[str]:
    import pandas as pd

    try:
        df = pd.read_csv(p, dtype=str, keep_default_na=False) if suffix == ".csv" else pd.read_parquet(p)
    except Exception as e:
        first = (str(e).strip().splitlines() or [""])[0]
        raise CliError(f"--prompts {p}: cannot read it as {suffix[1:]}: {type(e).__name__}: {first}") from e
    name = _pick([str(c) for c in df.columns], column, p)
    return [_text(v, f"{p}, row {i + 1}, column {name!r}") for i, v in enumerate(df[name].tolist())]


def _jsonl(p: Path, column: Optional[str]) -> list[str]:
    out = []
    with open(p, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except ValueError as e:
                raise CliError(f"{p}, line {n}: not JSON ({e}).") from None
            if isinstance(value, dict):
                value = value[_pick([str(k) for k in value], column, p)]
            elif column is not None:
                raise CliError(f"--column {column!r}: {p}, line {n} is not a JSON object.")
            out.append(_text(value, f"{p}, line {n}"))
    return out
