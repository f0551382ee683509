"""Offline models and the script builders that drive them, for tests, notebooks and demos.

``ScriptedModel(steps)`` plays one list of items per model call; the items are built with
:func:`text`, :func:`reasoning`, :func:`tool_call`, :func:`output`, :func:`usage` and
:func:`fail`. ``FunctionModel(fn)`` lets a function decide each reply. The builders are
also importable from ``we0nb`` itself (aliases kept for existing code and notebooks).
"""

from .models.scripted import FunctionModel, ScriptedModel, fail, output, reasoning, text, tool_call, usage

__all__ = ["ScriptedModel", "FunctionModel", "text", "reasoning", "tool_call", "output", "usage", "fail"]
