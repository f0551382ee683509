"""compare_df and we0nb.compare (SPEC §12): sessions step by step, side by side."""

from __future__ import annotations

import asyncio

import pytest

import we0nb
from we0nb import ScriptedModel, We0Agent, compare_df, text, tool_call, tool, user_message
from we0nb.testing import usage


@tool(side_effects=False)
def lookup(q: str) -> str:
    return f"found {q}"


def _two(store):
    a = We0Agent(ScriptedModel([[tool_call("lookup", {"q": "x"}), usage(10, 2)], [text("answer <b>A</b>"),
                                                                                 usage(20, 3)]]),
                 tools=[lookup], persistence=store)
    b = We0Agent(ScriptedModel([[text("answer B"), usage(7, 1)]]), tools=[lookup], persistence=store)

    async def go():
        await a.invoke(session_id="ses_a", messages=[user_message("q")])
        await b.invoke(session_id="ses_b", messages=[user_message("q")])

    asyncio.run(go())


def test_compare_df_rows_by_session_then_step(store):
    _two(store)
    df = compare_df(store, ["ses_b", "ses_a"])
    assert list(df.columns[:8]) == ["session_id", "step", "text", "tool_calls", "input_tokens", "output_tokens",
                                    "duration", "cost"]
    assert list(zip(df["session_id"], df["step"])) == [("ses_b", 1), ("ses_a", 1), ("ses_a", 2)]
    assert list(df["text"]) == ["answer B", "", "answer <b>A</b>"]
    assert list(df["tool_calls"]) == [[], ["lookup"], []]
    assert list(df["input_tokens"]) == [7, 10, 20]
    assert df["cost"].isna().all()  # (a scripted model has no price: unknown, never 0)
    with pytest.raises(ValueError, match="session 'ses_zz' is not in this store"):
        compare_df(store, ["ses_a", "ses_zz"])


def test_compare_view_escapes_and_highlights(store):
    _two(store)
    view = we0nb.compare(store, ["ses_a", "ses_b"])
    page = view._repr_html_()
    assert "answer &lt;b&gt;A&lt;/b&gt;" in page and "<b>A</b>" not in page
    assert "we0-cmp-diff" in page  # ses_b's step 1 differs from ses_a's
    plain = repr(view)
    assert "* step 1 ses_b: answer B" in plain and 'step 1 ses_a:  [lookup({"q":"x"})]' in plain


def test_compare_highlights_other_tool_arguments(store):
    def agent(q):
        return We0Agent(ScriptedModel([[tool_call("lookup", {"q": q})], [text("same")]]), tools=[lookup],
                        persistence=store)

    async def go():
        await agent("x").invoke(session_id="ses_x", messages=[user_message("q")])
        await agent("y").invoke(session_id="ses_y", messages=[user_message("q")])

    asyncio.run(go())
    plain = repr(we0nb.compare(store, ["ses_x", "ses_y"]))
    assert '* step 1 ses_y:  [lookup({"q":"y"})]' in plain and "* step 2" not in plain
