"""llama-cpp-python's server as :func:`~we0nb.local_model` runs it: its ``chatml-function-calling``
chat format made to show the model what was sent.

Why: that format (llama-cpp-python 0.3) renders its prompt with Jinja's HTML autoescape on, so
every quote, ``<`` and ``&`` of a message reached the model as an HTML entity (``"`` as
``&#34;``, which the model then copied into its answers and its structured output); and its
template has no case for the ``tool`` role, so a tool's result never reached the model (an
empty, unterminated ``<|im_start|>tool`` turn stood in its place). Here, before the server
starts: the format's module renders without escaping, and a tool result is sent as a user
turn that names the function (``functions.NAME returned:``, the format's own way of naming
a call). Run as ``python -m we0nb.models._llama_server`` with the server's own arguments.
"""

from __future__ import annotations

import runpy
from typing import Any

__all__ = ["with_tool_results", "patch"]

#: the chat format this module mends (the one local_model uses)
FORMAT = "chatml-function-calling"


def with_tool_results(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with each ``tool`` message as a user turn naming its function (by the id of
    the assistant's call it answers)."""
    names: dict[str, str] = {}
    out = []
    for m in messages:
        for call in m.get("tool_calls") or []:
            names[call.get("id", "")] = call.get("function", {}).get("name", "tool")
        if m.get("role") == "tool":
            name = names.get(m.get("tool_call_id", ""), "tool")
            content = m.get("content")
            if isinstance(content, list):  # (content parts: their text)
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            m = {"role": "user", "content": f"functions.{name} returned:\n{content or ''}"}
        out.append(m)
    return out


class _NoAutoescape:
    """The ``jinja2`` module as the chat formats see it, but for ``select_autoescape``: never."""

    def __init__(self, jinja2: Any):
        self._jinja2 = jinja2

    def __getattr__(self, name: str) -> Any:
        return getattr(self._jinja2, name)

    @staticmethod
    def select_autoescape(*args: Any, **kwargs: Any) -> Any:
        return lambda template_name=None: False


def patch() -> None:
    """Mend :data:`FORMAT` in llama-cpp-python's registry of chat formats (this process only)."""
    import jinja2
    import llama_cpp.llama_chat_format as formats

    formats.jinja2 = _NoAutoescape(jinja2)  # type: ignore[assignment]
    registry = formats.LlamaChatCompletionHandlerRegistry()
    original = registry.get_chat_completion_handler_by_name(FORMAT)

    def handler(*args: Any, **kwargs: Any) -> Any:
        if isinstance(kwargs.get("messages"), list):
            kwargs["messages"] = with_tool_results(kwargs["messages"])
        return original(*args, **kwargs)

    registry.register_chat_completion_handler(FORMAT, handler, overwrite=True)


if __name__ == "__main__":
    patch()
    runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)
