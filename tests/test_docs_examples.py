"""Every Python example of the README and the docs runs, so none can rot.

Each Markdown file's ```python blocks run in order in one namespace, as a notebook's cells
would (top-level ``await`` works), in a fresh folder. A block the reader cannot run here
(an API key, a hosted server) says so in a comment on the line before it, and is skipped
with that reason:

    <!-- docs: skip (needs an OpenAI API key) -->

A block that is one of several alternatives, or continues a line of thought, runs like the
others: write examples that run.
"""

from __future__ import annotations

import ast
import asyncio
import re
import types
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
_BLOCK = re.compile(r"(?:<!--\s*docs:\s*skip\s*\((?P<why>[^)]*)\)\s*-->\s*\n)?```python\n(?P<code>.*?)```", re.S)


def blocks(path: Path) -> list[tuple[int, str, str | None]]:
    """``(line, code, skip reason)`` of each Python block of a Markdown file."""
    text = path.read_text(encoding="utf-8")
    out = []
    for m in _BLOCK.finditer(text):
        line = text.count("\n", 0, m.start("code")) + 1
        out.append((line, m.group("code"), m.group("why")))
    return out


def _params() -> list[Any]:
    return [pytest.param(p, id=str(p.relative_to(ROOT))) for p in FILES if blocks(p)]


@pytest.mark.parametrize("path", _params())
def test_the_examples_of_a_page_run(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    asyncio.run(_run_page(path))


async def _run_page(path: Path) -> None:
    namespace: dict[str, Any] = {"__name__": "__docs__"}
    for line, code, skip in blocks(path):
        if skip is not None:
            continue
        where = f"{path.relative_to(ROOT)}:{line}"
        try:
            compiled = compile(code, where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        except SyntaxError as e:
            raise AssertionError(f"the example at {where} is not valid Python: {e}") from None
        result = eval(compiled, namespace)  # noqa: S307 - the project's own documentation
        if isinstance(result, types.CoroutineType):
            await result


def test_a_skip_says_why() -> None:
    for path in FILES:
        text = path.read_text(encoding="utf-8")
        for m in re.finditer(r"<!--\s*docs:\s*skip(.*?)-->", text):
            assert re.fullmatch(r"\s*\([^)]+\)\s*", m.group(1)), f"{path.name}: a skip without its reason"
