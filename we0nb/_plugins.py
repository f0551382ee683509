"""Hooks a lower layer offers and an upper layer fills, so no import goes upward.

The data model (:mod:`we0nb.messages`) renders itself in a notebook, but the renderer lives in
the notebook layer, above it. The data model asks this registry for the renderer; the package
that composes the layers (``we0nb/__init__.py``) connects it once, at ``import we0nb`` — which
Python always runs before any ``we0nb.*`` module.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

__all__ = ["use_display", "display_bundle"]

Renderer = Callable[[Any], dict[str, str]]

_DISPLAY: Optional[Renderer] = None


def use_display(renderer: Renderer) -> None:
    """Connect the notebook renderer (``obj -> {mime type: text}``) to the data model's display."""
    global _DISPLAY
    _DISPLAY = renderer


def display_bundle(obj: Any) -> dict[str, str]:
    """``obj``'s rich display (text/html + text/plain); its ``repr`` alone when no renderer is connected."""
    if _DISPLAY is None:
        return {"text/plain": repr(obj)}
    return _DISPLAY(obj)
