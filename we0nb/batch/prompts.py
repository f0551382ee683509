"""The prompts of a batch: what ``agent.batch(prompts)`` accepts, as stored items.

Each prompt is a string or a list of ``user_message(...)``; ``prompts`` is a list of them or
a pandas Series (a DataFrame column; a one-column DataFrame is taken as its column). An
item is stored as the JSON list of its messages' texts, which is also what a continuation
compares to tell "the same batch" from "another batch under the same name".
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Optional, Sequence

from .._ids import new_id
from .._text import clean
from ..engine.request import UserInput, check_session_id
from ..persistence.batches import NewItem

__all__ = ["batch_items", "prompt_messages", "new_batch_name", "prompt_text"]


def new_batch_name() -> str:
    """A readable, unique name: ``batch-YYYYmmdd-HHMMSS-xxxxxx``."""
    return time.strftime("batch-%Y%m%d-%H%M%S-") + os.urandom(3).hex()


def batch_items(prompts: Any, session_ids: Optional[Sequence[str]]) -> list[NewItem]:
    """Validate ``prompts`` (and ``session_ids``) into the items a batch stores."""
    values = _values(prompts)
    if not values:
        raise ValueError("batch(prompts): the list of prompts is empty; give at least one prompt.")
    texts = [_prompt(i, p) for i, p in enumerate(values)]
    if session_ids is None:
        sids = [new_id("ses") for _ in texts]
    else:
        sids = _session_ids(session_ids, len(texts))
    return [NewItem(prompt=json.dumps(t, ensure_ascii=False), session_id=s) for t, s in zip(texts, sids)]


def prompt_messages(prompt: str) -> list[UserInput]:
    """A stored prompt back as the ``messages=`` of its first run."""
    return [UserInput(t) for t in json.loads(prompt)]


def _values(prompts: Any) -> list[Any]:
    mod = type(prompts).__module__
    if mod.startswith("pandas"):
        if hasattr(prompts, "columns"):  # a DataFrame: only a single column is unambiguous
            if len(prompts.columns) != 1:
                raise TypeError("batch(prompts=DataFrame): pass one column, e.g. agent.batch(df['question']).")
            prompts = prompts.iloc[:, 0]
        return list(prompts.tolist())
    if isinstance(prompts, (str, bytes, UserInput)) or not isinstance(prompts, Sequence):
        raise TypeError(
            "batch(prompts): expected a list of prompts (strings, or lists of user_message(...)), or a "
            f"DataFrame column; got {type(prompts).__name__}. A single prompt is a list of one: [prompt]."
        )
    return list(prompts)


def _prompt(i: int, p: Any) -> list[str]:
    if isinstance(p, str):
        return [clean(p)]
    if isinstance(p, UserInput):
        return [p.text]
    if isinstance(p, Sequence) and not isinstance(p, bytes) and p and all(isinstance(m, UserInput) for m in p):
        return [m.text for m in p]
    raise TypeError(
        f"batch(prompts): item {i} is {type(p).__name__} {p!r:.60}; each prompt must be a string or a "
        "non-empty list of user_message(...)."
    )


def _session_ids(session_ids: Sequence[str], n: int) -> list[str]:
    if isinstance(session_ids, (str, bytes)) or not isinstance(session_ids, Sequence):
        raise TypeError("batch(session_ids=...): expected a list of session ids, one per prompt.")
    sids = list(session_ids)
    if len(sids) != n:
        raise ValueError(f"batch(session_ids=...): {len(sids)} session ids for {n} prompts; give one per prompt.")
    seen: dict[str, int] = {}
    for i, s in enumerate(sids):
        check_session_id(s, f"session_ids[{i}]")
        if s in seen:
            raise ValueError(f"batch(session_ids=...): items {seen[s]} and {i} have the same session id {s!r}; "
                             "each item needs a session of its own.")
        seen[s] = i
    return sids


def prompt_text(prompt_json: str) -> str:
    """A stored prompt as one string (its messages joined by blank lines)."""
    try:
        texts = json.loads(prompt_json)
    except ValueError:
        return prompt_json
    return "\n\n".join(texts) if isinstance(texts, list) else str(texts)
