"""Models behind the provider-neutral port."""

from .base import *  # noqa: F401,F403
from .base import __all__ as _base_all
from .scripted import FunctionModel, ScriptedModel, fail, output, reasoning, text, tool_call, usage

__all__ = [*_base_all, "ScriptedModel", "FunctionModel", "text", "reasoning", "tool_call", "output", "usage",
           "fail", "OpenAIChatModel", "AnthropicModel"]


def __getattr__(name: str):
    if name == "OpenAIChatModel":
        from .openai import OpenAIChatModel

        return OpenAIChatModel
    if name == "AnthropicModel":
        from .anthropic import AnthropicModel

        return AnthropicModel
    raise AttributeError(name)
