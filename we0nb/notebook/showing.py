"""``we0nb.show``: a run rendered live in the cell, with Approve / Deny below it when it waits.

Its own module because it joins the live view and the run panel (which builds on the view).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from ..engine.request import user_message
from .live import Bundle, LiveView, _in_kernel
from .panel import RunPanel

__all__ = ["show"]


async def show(source: Any, prompt: Optional[str] = None, *, display: Optional[Callable[[Bundle], Any]] = None,
               handle: Any = None, interval: float = 0.05, title: Optional[str] = None,
               max_bytes_per_s: Optional[float] = 200_000, **stream_kwargs: Any) -> Any:
    """Render a run live in the current cell and return its RunResult (None when aborted).

    ``source`` is the async iterator of ``agent.stream(...)``, or an agent: then
    ``prompt`` (a string) and/or ``stream_kwargs`` (``session_id=``, ``mode=``,
    ``abort=``, ``messages=``) are passed to ``agent.stream()``.

    A run that ends with calls awaiting a person's decision (``result == "approval"``)
    shows them in the view; with an agent as ``source`` (in a kernel), Approve / Deny
    buttons follow below — a :class:`~we0nb.notebook.RunPanel` on the session, whose
    resumed run continues in this same view. (A bare stream does not know its agent: the
    view then says how to decide.)
    """
    agent = None
    if hasattr(source, "stream") and hasattr(source, "persistence"):
        agent = source
        if prompt is not None:
            if "messages" in stream_kwargs:
                raise TypeError("show(agent, prompt, messages=...): pass either a prompt or messages, not both.")
            stream_kwargs["messages"] = [user_message(prompt)]
        stream = source.stream(**stream_kwargs)
    else:
        if prompt is not None or stream_kwargs:
            raise TypeError("show(stream): prompt and stream options are only accepted with an agent; "
                            "pass them to agent.stream(...) instead.")
        if not hasattr(source, "__aiter__"):
            raise TypeError(f"show() expects agent.stream(...) or an agent, got {type(source).__name__}.")
        stream = source
    view = LiveView(interval=interval, display=display, handle=handle, title=title,
                    max_bytes_per_s=max_bytes_per_s)
    view.start()
    if agent is not None and stream_kwargs.get("mode") == "resume" and stream_kwargs.get("session_id"):
        # a resume continues the stored turn: show it first (the user's message, what the cut reply
        # holds), then the run updates it in place
        view.show_turn((await agent.transcript(stream_kwargs["session_id"])).messages)
    result = await view.consume(stream)
    if agent is not None and view.awaiting and _in_kernel():
        _approval_panel(agent, view)
    return result


def _approval_panel(agent: Any, view: LiveView) -> Any:
    """The Approve / Deny rows for the calls ``view``'s run left awaiting, displayed below it."""
    panel = RunPanel(agent, view.session_id, check=False, view=view)
    panel._await_decisions(view.awaiting)
    panel.display_controls()
    return panel
