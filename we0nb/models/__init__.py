"""Models behind the provider-neutral port.

The port (:mod:`.base`) and the offline models (:mod:`.scripted`) load with the package;
the provider adapters and the local model load on first use (:data:`_LAZY`), so ``import
we0nb`` stays light. Modules whose name starts with ``_`` are implementation details.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .base import (
    AssistantTurn,
    FinishEvent,
    Model,
    ModelEvent,
    ModelMessage,
    ModelPrice,
    ModelRequest,
    OutputMode,
    ReasoningBlock,
    ReasoningDelta,
    ReasoningEnd,
    TextDelta,
    ToolCall,
    ToolCallEvent,
    ToolResult,
    ToolSchema,
    UserTurn,
)
from .scripted import FunctionModel, ScriptedModel, fail, output, reasoning, text, tool_call, usage

if TYPE_CHECKING:  # the lazy names, for IDEs and type checkers
    from .anthropic import AnthropicModel
    from .local import LocalModel, local_model
    from .openai import OpenAIChatModel

__all__ = [
    "UserTurn", "ToolCall", "ReasoningBlock", "AssistantTurn", "ToolResult", "ModelMessage", "ToolSchema",
    "ModelRequest", "OutputMode", "TextDelta", "ReasoningDelta", "ReasoningEnd", "ToolCallEvent", "FinishEvent",
    "ModelEvent", "ModelPrice", "Model",
    "ScriptedModel", "FunctionModel", "text", "reasoning", "tool_call", "output", "usage", "fail",
    "OpenAIChatModel", "AnthropicModel", "LocalModel", "local_model",
]

#: names imported from their module on first use
_LAZY = {
    "OpenAIChatModel": ".openai",
    "AnthropicModel": ".anthropic",
    "LocalModel": ".local",
    "local_model": ".local",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value
