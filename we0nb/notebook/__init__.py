"""The notebook layer: display hooks, the live view, the run panel, magics, sync helpers.

Importing this package imports neither pandas nor ipywidgets: the data-frame views
(``sessions_df`` …) load their modules on first use, the panel imports ipywidgets when built.
"""

from __future__ import annotations

from typing import Any

from .html import esc, mimebundle, render_html, render_text
from .live import LiveView
from .showing import show
from .sync import invoke_sync, run_sync

__all__ = [
    "show", "LiveView", "RunPanel", "run_sync", "invoke_sync",
    "render_html", "render_text", "mimebundle", "esc", "load_ipython_extension",
    "sessions_df", "messages_df", "parts_df", "tool_calls_df", "expand_json", "session_summary",
    "plot_timeline", "plot_tools",
]

_FRAMES = ("sessions_df", "messages_df", "parts_df", "tool_calls_df", "expand_json", "session_summary")


def load_ipython_extension(ipython: Any) -> None:
    from .magics import load_ipython_extension as load

    load(ipython)


def __getattr__(name: str) -> Any:
    import importlib

    if name == "RunPanel":
        return importlib.import_module(".panel", __name__).RunPanel
    if name in _FRAMES:
        return getattr(importlib.import_module(".frames", __name__), name)
    if name in ("plot_timeline", "plot_tools"):
        return getattr(importlib.import_module(".plots", __name__), name)
    raise AttributeError(f"module 'we0nb.notebook' has no attribute {name!r}")
