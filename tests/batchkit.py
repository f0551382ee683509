"""A batch workload the tests share: a model that decides from the history it is sent.

Each item's turn: ``steps`` steps that each call ``act`` (a side effect that appends one line
to a ledger) or ``look`` (read-only), then an answer naming the prompt. The model counts
the tool results it has seen, so the same model serves a first run and any resume; it can
be told to fail, to rate-limit, or to ask for an approval on chosen prompts.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any, Callable, Optional

from we0nb import FunctionModel, ModelProviderError, We0Agent, text, tool, tool_call
from we0nb.models.base import ToolResult, UserTurn


class Ledger:
    """Side effects as lines of a file: ``{"prompt": …, "n": …, "pid": …}`` (append-only)."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def add(self, prompt: str, n: int) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"prompt": prompt, "n": n, "pid": os.getpid()}) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def lines(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]


def first_user(request: Any) -> str:
    return next(m.text for m in request.messages if isinstance(m, UserTurn))


def seen_results(request: Any) -> int:
    return sum(1 for m in request.messages if isinstance(m, ToolResult))


def make_agent(persistence: Any, ledger: Ledger, *, steps: int = 3, delay: float = 0.0,
               tool_delay: float = 0.0, fail: Callable[[str], bool] = lambda p: False,
               rate_limit: Optional[dict[str, int]] = None, approval: Callable[[str], bool] = lambda p: False,
               calls: Optional[list[str]] = None) -> We0Agent:
    """``fail(prompt)``: the model raises on that prompt; ``rate_limit``: prompt → how many 429s
    it gets first; ``approval(prompt)``: its ``act`` calls need a person's approval."""
    rate_limit = dict(rate_limit or {})

    @tool(requires_approval=lambda input: approval(input["prompt"]))
    async def act(prompt: str, n: int) -> str:
        """A side effect: one ledger line per execution."""
        await asyncio.to_thread(ledger.add, prompt, n)  # (a file write: off the event loop)
        if tool_delay:
            await asyncio.sleep(tool_delay)
        return f"acted {n}"

    @tool(side_effects=False)
    async def look(n: int) -> str:
        """Read-only."""
        return f"looked {n}"

    async def reply(request: Any) -> list:
        prompt = first_user(request)
        if calls is not None:
            calls.append(prompt)
        if delay:
            await asyncio.sleep(delay)
        if rate_limit.get(prompt, 0) > 0:
            rate_limit[prompt] -= 1
            raise ModelProviderError("429 Too Many Requests", status_code=429, retryable=True)
        if fail(prompt):
            raise RuntimeError(f"model broke on {prompt}")
        n = seen_results(request)
        if n < steps:
            if n % 2 == 0:
                return [tool_call("act", {"prompt": prompt, "n": n})]
            return [tool_call("look", {"n": n})]
        return [text(f"answer to {prompt}")]

    return We0Agent(FunctionModel(reply), tools=[act, look], persistence=persistence)
