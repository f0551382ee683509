"""Plots of transcripts: the session timeline and the tool latency/outcome charts (Agg backend)."""

from __future__ import annotations

import asyncio

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.colors import to_rgba  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from we0nb import MemoryPersistence, ScriptedModel, We0Agent  # noqa: E402
from we0nb.notebook.frames import tool_calls_df  # noqa: E402
from we0nb.notebook.plots import OUTCOMES, STEP_COLORS, TOOL_COLORS, plot_timeline, plot_tools, tool_outcome  # noqa: E402

from test_frames import build_history, copy_history  # noqa: E402


@pytest.fixture(scope="module")
def memory():
    return build_history()


def _bars(ax):
    return [p for p in ax.patches if isinstance(p, matplotlib.patches.Rectangle)]


def test_timeline_bars_per_step_and_call(memory):
    fig = plot_timeline(memory, "ses_b")
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    bars = _bars(ax)
    # 2 steps (the aborted one, closed by recovery, and the one after) + 2 tool calls
    assert len(bars) == 4
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == ["step 1", "  slow_read", "  send", "step 2"]
    colors = [b.get_facecolor() for b in bars]
    assert colors[0] == to_rgba(STEP_COLORS["recovered"])
    assert colors[1] == to_rgba(TOOL_COLORS["completed"]) and bars[1].get_hatch() == ".."  # recalled
    assert colors[2] == to_rgba(TOOL_COLORS["interrupted"])
    assert colors[3] == to_rgba(STEP_COLORS["completed"])
    assert all(b.get_width() > 0 for b in bars)
    assert plt.fignum_exists(fig.number) is False  # closed in pyplot: displayed once, as the cell value
    fig.canvas.draw()
    # the legend names what the plot shows, not every status there is
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert sorted(legend) == ["step completed", "step recovered", "tool completed", "tool interrupted"]


def test_timeline_counts_for_every_session(memory):
    calls = tool_calls_df(memory)
    for sid, steps in (("ses_a", 2), ("ses_c", 2), ("ses_d", 2), ("ses_e_manual", 1)):
        fig = plot_timeline(memory, sid)
        n_calls = int((calls["session_id"] == sid).sum())
        assert len(_bars(fig.axes[0])) == steps + n_calls, sid
    fig = plot_timeline(memory, "ses_c")
    colors = [b.get_facecolor() for b in _bars(fig.axes[0])]
    assert colors[1] == to_rgba(TOOL_COLORS["error"]) and colors[2] == to_rgba(TOOL_COLORS["interrupted"])


def test_timeline_into_given_axes_and_errors(memory):
    fig, ax = plt.subplots()
    try:
        assert plot_timeline(memory, "ses_a", ax=ax, title="mine") is fig
        assert ax.get_title() == "mine" and len(_bars(ax)) == 4
    finally:
        plt.close(fig)
    with pytest.raises(ValueError, match="no messages"):
        plot_timeline(memory, "nope")
    with pytest.raises(TypeError):
        plot_timeline(memory, ["ses_a"])


def test_timeline_unfinished_calls_are_hatched():
    """A session left aborted (not resumed): the step and the running call run to the end."""
    p = MemoryPersistence()
    from we0nb import text, tool, tool_call, user_message

    box = {}

    @tool
    async def hang() -> str:
        box["ev"].set()
        await asyncio.sleep(30)
        return "never"

    async def go():
        agent = We0Agent(ScriptedModel([[text("go"), tool_call("hang"), tool_call("hang")]]), [hang], persistence=p)
        box["ev"] = asyncio.Event()
        with pytest.raises(asyncio.CancelledError):
            await agent.invoke(abort=box["ev"], session_id="s", messages=[user_message("x")])

    asyncio.run(go())
    ax = plot_timeline(p, "s").axes[0]
    bars = _bars(ax)
    assert len(bars) == 3
    assert [b.get_hatch() for b in bars] == ["//", "//", "//"]
    assert [b.get_facecolor() for b in bars] == [to_rgba(STEP_COLORS["unfinished"]), to_rgba(TOOL_COLORS["running"]),
                                                 to_rgba(TOOL_COLORS["pending"])]


def test_tools_chart_bars(memory):
    fig = plot_tools(memory)
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    lat, out = fig.axes
    calls = tool_calls_df(memory)
    tools = sorted(calls["tool"].unique().tolist())
    assert len(tools) == 5
    assert len(_bars(lat)) == len(tools)
    assert len(_bars(out)) == len(OUTCOMES) * len(tools)  # one stacked segment per outcome per tool
    assert [t.get_text() for t in lat.get_yticklabels()] == tools
    # the stacked widths add up to each tool's number of calls
    widths = {}
    for b in _bars(out):
        y = round(b.get_y() + b.get_height() / 2)
        widths[y] = widths.get(y, 0) + b.get_width()
    assert [widths[i] for i in range(len(tools))] == [int((calls["tool"] == t).sum()) for t in tools]
    # median latency of a tool with finished calls is its bar's length
    look = calls[calls["tool"] == "lookup"]["duration"].dt.total_seconds().median()
    assert _bars(lat)[tools.index("lookup")].get_width() == pytest.approx(look)
    fig.canvas.draw()


def test_tools_chart_filters_empty_and_axes(memory):
    fig = plot_tools(memory, "ses_b")
    assert len(_bars(fig.axes[0])) == 2 and len(_bars(fig.axes[1])) == 2 * len(OUTCOMES)
    empty = plot_tools(MemoryPersistence())
    assert all(len(_bars(a)) == 0 for a in empty.axes)
    assert any(t.get_text() == "no tool calls" for t in empty.axes[0].texts)
    f, axes = plt.subplots(1, 2)
    try:
        assert plot_tools(memory, axes=axes) is f
    finally:
        plt.close(f)
    with pytest.raises(ValueError, match="two axes"):
        plot_tools(memory, axes=[axes[0]])


def test_tool_outcome(memory):
    calls = tool_calls_df(memory)
    out = tool_outcome(calls)
    doubt = calls["in_doubt"].fillna(False).astype(bool)
    assert out[calls["interrupted"] & ~doubt].eq("interrupted").all() and doubt.any()
    assert out[doubt].eq("in_doubt").all()  # (interrupted while running: it may have run)
    assert (out == "error").sum() == int(((calls["status"] == "error") & ~calls["interrupted"]).sum())
    assert list(out.cat.categories) == ["completed", "reconciled", "error", "denied", "in_doubt", "interrupted",
                                        "unfinished"]


def test_a_denied_call_is_its_own_outcome_not_a_failure():
    """A person's Deny is a decision: plot_tools shows it as "denied" and its failure rate
    leaves it out (it used to count as an error)."""
    from we0nb import text, tool, tool_call, user_message

    @tool(requires_approval=True)
    def pay(to: str) -> str:
        return f"paid {to}"

    @tool(side_effects=False)
    def look(q: str) -> str:
        return "found"

    store = MemoryPersistence()
    agent = We0Agent(ScriptedModel([
        [tool_call("look", {"q": "x"}), tool_call("pay", {"to": "ann"})],
        [text("Not paid: denied.")],
    ]), tools=[pay, look], persistence=store)

    async def go() -> None:
        first = await agent.invoke(session_id="s", messages=[user_message("pay ann")])
        assert first.result == "approval"
        await agent.deny("s", first.approvals[0].call_id, reason="no")
        assert (await agent.invoke(mode="resume", session_id="s")).result == "stop"

    asyncio.run(go())
    calls = tool_calls_df(store)
    out = dict(zip(calls["tool"].astype(str), tool_outcome(calls).astype(str)))
    assert out == {"look": "completed", "pay": "denied"}
    fig = plot_tools(store)
    labels = [t.get_text().strip() for t in fig.axes[1].texts]
    assert labels == ["0% failed", "0% failed"]
    plt.close(fig)


def test_plots_same_on_sqlite(memory, tmp_path):
    from we0nb import SqlPersistence

    sp = SqlPersistence(f"sqlite:///{tmp_path / 'p.db'}")
    asyncio.run(copy_history(memory, sp))
    for make in (lambda p: plot_tools(p), lambda p: plot_timeline(p, "ses_b")):
        a, b = make(memory), make(sp)
        for ax_a, ax_b in zip(a.axes, b.axes):
            geo = lambda ax: [(r.get_x(), r.get_y(), r.get_width(), r.get_facecolor()) for r in _bars(ax)]  # noqa: E731
            assert geo(ax_a) == geo(ax_b)


def _contrast(a, b) -> float:
    def lum(c):
        r, g, b_ = (x / 12.92 if x <= 0.03928 else ((x + 0.055) / 1.055) ** 2.4 for x in to_rgba(c)[:3])
        return 0.2126 * r + 0.7152 * g + 0.0722 * b_
    hi, lo = sorted((lum(a), lum(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


@pytest.mark.parametrize("plot", ["timeline", "tools"])
def test_plots_read_on_light_and_dark_themes(memory, plot):
    """A transparent figure with mid-grey ink: the notebook's own background shows through."""
    import io

    from PIL import Image

    from we0nb.notebook.plots import INK

    fig = plot_timeline(memory, "ses_b") if plot == "timeline" else plot_tools(memory)
    ax = fig.axes[0]
    assert to_rgba(fig.get_facecolor())[3] == 0 and to_rgba(ax.get_facecolor())[3] == 0
    assert to_rgba(ax.title.get_color()) == to_rgba(INK)
    assert all(to_rgba(t.get_color()) == to_rgba(INK) for t in ax.get_yticklabels())
    for background in ("#ffffff", "#111111", "#212121"):  # JupyterLab Light and Dark layout colours
        assert _contrast(INK, background) >= 3.5, background
    buf = io.BytesIO()
    fig.savefig(buf, format="png", facecolor=fig.get_facecolor())  # what IPython's inline display does
    img = Image.open(io.BytesIO(buf.getvalue())).convert("RGBA")
    assert img.getpixel((1, 1))[3] == 0  # the corner is transparent


def test_theme_none_keeps_the_users_style(memory):
    with plt.style.context("dark_background"):
        fig = plot_timeline(memory, "ses_b", theme=None)
    assert to_rgba(fig.get_facecolor()) == to_rgba("black")
    with pytest.raises(ValueError, match="theme"):
        plot_tools(memory, theme="dark")
