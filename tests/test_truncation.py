"""A reply cut at the token limit is visible: on RunResult and in the live view."""

from __future__ import annotations

from we0nb import We0Agent, user_message
from we0nb.models.base import FinishEvent, Model, TextDelta
from we0nb.notebook import show
from we0nb.notebook.live import TRUNCATED


class CutModel(Model):
    """Replies "Once upon a" and stops at the token limit (finish reason "length")."""

    model_id = "cut"

    async def stream(self, request):  # type: ignore[override]
        yield TextDelta("Once upon a")
        yield FinishEvent("length")


class Handle:
    def __init__(self):
        self.bundles = []

    def update(self, bundle):
        self.bundles.append(bundle)


async def test_truncated_reply_on_the_result():
    r = await We0Agent(CutModel()).invoke(session_id="s", messages=[user_message("a story")])
    assert r.result == "stop" and r.finish_reason == "length" and r.truncated
    assert r.text == "Once upon a"


async def test_truncated_reply_in_the_live_view():
    handle = Handle()
    r = await show(We0Agent(CutModel()), "a story", handle=handle, session_id="s")
    assert r.truncated
    final = handle.bundles[-1]
    assert "Truncated" in final["text/html"] and "token limit" in final["text/html"]
    assert TRUNCATED in final["text/plain"]
