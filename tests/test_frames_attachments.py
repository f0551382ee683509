"""``tool_calls_df["attachments"]``: how many attachments (images, audio, files, links) each call's
result has — read off the stored JSON on every store (0 for a call with none, or unfinished)."""

from __future__ import annotations

from typing import Any

import pytest

from we0nb import ScriptedModel, We0Agent, text, tool, tool_call, user_message
from we0nb.messages import Attachment
from we0nb.notebook.frames import tool_calls_df
from we0nb.tools import ToolReturn

STORES = ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@tool
def snapshot(n: int) -> ToolReturn:
    """Returns n small images and a link."""
    images = [Attachment(type="image", mime_type="image/png", data="iVBORw0KGgo=") for _ in range(n)]
    return ToolReturn(f"{n} images", (*images, Attachment(type="link", uri="https://example.org/r", name="r")))


@tool
def plain() -> str:
    return "no attachments"


async def test_the_attachments_column_counts_each_calls_attachments(store: Any) -> None:
    model = ScriptedModel([[tool_call("snapshot", {"n": 2}), tool_call("plain", {}), tool_call("snapshot", {"n": 0})],
                           [text("done")]])
    agent = We0Agent(model, tools=[snapshot, plain], persistence=store)
    await agent.invoke(session_id="ses_att", messages=[user_message("go")])
    calls = tool_calls_df(store, "ses_att")
    assert calls["attachments"].dtype == "int64"
    assert list(zip(calls["tool"], calls["attachments"])) == [("snapshot", 3), ("plain", 0), ("snapshot", 1)]
    cols = list(calls.columns)
    assert cols[cols.index("metadata") + 1] == "attachments"
