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
from typing import Any, Iterator, Optional

from ._common import CliError

__all__ = ["load_agent", "read_prompts", "PROMPT_SUFFIXES"]

PROMPT_SUFFIXES = (".jsonl", ".csv", ".parquet")


def _split(spec: str) -> tuple[str, str]:
    module, sep, attr = spec.partition(":")
    if not sep or not module.strip() or not attr.strip() or ":" in attr:
        raise CliError(f"the agent {spec!r} is not MODULE:ATTR: name a module and its agent, e.g. "
                       "myproject.agents:agent (a We0Agent, or a function returning one).")
    return module.strip(), attr.strip()


def _first(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0]


def _exited(e: SystemExit, doing: str) -> CliError:
    """The user's code called ``sys.exit`` while the agent loaded: said, never a silent exit."""
    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    extra = f" ({e.code})" if isinstance(e.code, str) else ""
    return CliError(f"loading the agent: {doing} exited with code {code}{extra} (it called sys.exit or raised "
                    "SystemExit): load the agent without exiting.")


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
    except SystemExit as e:
        raise _exited(e, f"importing {module!r} (from {spec})") from e
    except Exception as e:
        raise CliError(f"importing {module!r} (from {spec}) failed: {type(e).__name__}: {_first(e)}") from e


def _attribute(value: Any, module: str, attr: str, spec: str) -> Any:
    """``attr`` (dots go deeper) of the module; what its code raises is its error, not ours."""
    for part in attr.split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            raise CliError(f"{module!r} has no attribute {attr!r} (from {spec}).") from None
        except SystemExit as e:
            raise _exited(e, f"reading {spec}") from e
        except Exception as e:  # (a module-level __getattr__, a property)
            raise CliError(f"{spec} failed: {type(e).__name__}: {_first(e)}") from e
    return value


async def _call(factory: Any, spec: str) -> Any:
    try:
        value = factory()
        if asyncio.iscoroutine(value):
            value = await value
    except SystemExit as e:
        raise _exited(e, f"calling {spec}()") from e
    except Exception as e:
        raise CliError(f"{spec}() failed: {type(e).__name__}: {_first(e)}") from e
    return value


def _a(value: Any) -> str:
    """``None``, ``the class X``, ``an int``, ``a str``: what a value is, in a sentence."""
    if value is None:
        return "None"
    if isinstance(value, type):
        return f"the class {value.__name__}"
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


async def load_agent(spec: str) -> Any:
    """The :class:`~we0nb.We0Agent` ``spec`` (``MODULE:ATTR``) names; a function is called for it."""
    from .. import We0Agent

    module, attr = _split(spec)
    value = _attribute(_import(module, spec), module, attr, spec)
    if isinstance(value, We0Agent):
        return value
    if not callable(value) or isinstance(value, type):
        raise CliError(f"{spec} is {_a(value)}, not a We0Agent or a function returning one.")
    value = await _call(value, spec)
    if not isinstance(value, We0Agent):
        raise CliError(f"{spec}() returned {_a(value)}, not a We0Agent.")
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
    except ImportError:  # (pandas reads parquet through pyarrow, a dependency of we0nb: removed since)
        raise CliError(f"--prompts {p}: reading a .parquet file needs pyarrow, which is not installed here: "
                       "pip install pyarrow (or give the prompts as .jsonl or .csv).") from None
    except Exception as e:
        first = (str(e).strip().splitlines() or [""])[0]
        raise CliError(f"--prompts {p}: cannot read it as {suffix[1:]}: {type(e).__name__}: {first}") from e
    name = _pick([str(c) for c in df.columns], column, p)
    return [_text(v, f"{p}, row {i + 1}, column {name!r}") for i, v in enumerate(df[name].tolist())]


def _lines(p: Path) -> Iterator[tuple[int, str]]:
    """The file's lines, numbered; one that is not UTF-8 is named (file and line)."""
    with open(p, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                yield n, raw.decode("utf-8-sig" if n == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise CliError(f"--prompts {p}, line {n}: not UTF-8 text ({e.reason} at byte {e.start + 1} of "
                               "the line); save the file as UTF-8.") from None


def _jsonl(p: Path, column: Optional[str]) -> list[str]:
    out, key = [], column
    for n, line in _lines(p):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError as e:
            raise CliError(f"{p}, line {n}: not JSON ({e}).") from None
        if isinstance(value, dict):
            key = key or _pick([str(k) for k in value], None, p)  # (the first object's choice holds for all)
            value = value[key] if key in value else _no_key(p, n, value, column, key)
        elif column is not None:
            raise CliError(f"--column {column!r}: {p}, line {n} is not a JSON object.")
        out.append(_text(value, f"{p}, line {n}"))
    return out


def _no_key(p: Path, n: int, value: dict[str, Any], column: Optional[str], key: str) -> Any:
    keys = ", ".join(list(value)[:10]) or "none"
    if column is not None:
        raise CliError(f"--column {column!r}: {p}, line {n} has no such key (keys: {keys}).")
    raise CliError(f"--prompts {p}, line {n}: no {key!r} key, the prompts' column (keys: {keys}); every "
                   "object needs it, or name the column with --column.")
