"""we0nb — a Jupyter-first asyncio agent engine whose resume never repeats a side effect.

The names of SPEC.md are re-exported here; everything else lives in sub-packages.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .engine import RunRequest, RunResult, We0Agent, plan_recovery, user_message
from .errors import (
    CompactionError,
    ContextWindowExceeded,
    CorruptRecordError,
    LeaseLostError,
    ModelAuthenticationError,
    ModelProviderError,
    MaxStepsExceeded,
    MCPServerError,
    ModelError,
    OutputValidationError,
    PersistenceError,
    SchemaVersionError,
    ScriptExhaustedError,
    SessionBusyError,
    We0Error,
)
from ._extras import MissingExtraError
from .messages import (
    AssistantMessage,
    CompactionPart,
    MessageError,
    MessageWithParts,
    Part,
    ReasoningPart,
    Session,
    StepFinishPart,
    StepStartPart,
    TextPart,
    ToolPart,
    ToolState,
    ToolStateCompleted,
    ToolStateError,
    ToolStatePending,
    ToolStateRunning,
    Transcript,
    Usage,
    UserMessage,
)
from .models import FunctionModel, Model, ModelRequest, ScriptedModel
from .persistence import MemoryPersistence, Persistence
from .testing import fail, output, reasoning, text, tool_call, usage  # aliases of we0nb.testing
from .tools import AnyToolDefinition, ToolDefinition, ToolPolicy, tool

if TYPE_CHECKING:  # the lazy names, for IDEs and type checkers
    from .mcp import MCPServer
    from .models.anthropic import AnthropicModel
    from .models.local import local_model
    from .models.openai import OpenAIChatModel
    from .notebook.frames import expand_json, messages_df, parts_df, session_summary, sessions_df, tool_calls_df
    from .notebook.live import show
    from .notebook.plots import plot_timeline, plot_tools
    from .batch import BatchResult
    from .notebook.batch_frames import batch_df, batches_df
    from .persistence.sql import SqlPersistence


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("we0nb")
    except PackageNotFoundError:  # a checkout on sys.path, not installed
        return "0+unknown"


__version__ = _version()

__all__ = [
    "We0Agent", "RunRequest", "RunResult", "user_message", "plan_recovery",
    "MemoryPersistence", "SqlPersistence", "Persistence",
    "tool", "AnyToolDefinition", "ToolDefinition", "ToolPolicy",
    "Model", "ModelRequest", "ScriptedModel", "FunctionModel", "OpenAIChatModel", "AnthropicModel", "local_model",
    "text", "reasoning", "tool_call", "output", "usage", "fail",
    "Session", "UserMessage", "AssistantMessage", "MessageError", "Usage", "Transcript", "MessageWithParts",
    "Part", "TextPart", "ReasoningPart", "ToolPart", "StepStartPart", "StepFinishPart", "CompactionPart",
    "ToolState", "ToolStatePending", "ToolStateRunning", "ToolStateCompleted", "ToolStateError",
    "We0Error", "SessionBusyError", "LeaseLostError", "MaxStepsExceeded", "ModelError", "OutputValidationError",
    "ScriptExhaustedError", "PersistenceError", "CorruptRecordError", "SchemaVersionError",
    "ModelProviderError", "ModelAuthenticationError", "ContextWindowExceeded", "CompactionError",
    "MissingExtraError", "MCPServer", "MCPServerError",
    "show", "sessions_df", "messages_df", "parts_df", "tool_calls_df", "session_summary", "expand_json",
    "plot_timeline", "plot_tools",
    "BatchResult", "batches_df", "batch_df",
    "load_ipython_extension",
]

#: names imported on first use (``import we0nb`` stays light: no SQLAlchemy engine, no openai, no pandas)
_LAZY = {
    "SqlPersistence": "we0nb.persistence.sql",
    "OpenAIChatModel": "we0nb.models.openai",
    "AnthropicModel": "we0nb.models.anthropic",
    "MCPServer": "we0nb.mcp",
    "local_model": "we0nb.models.local",
    "show": "we0nb.notebook.live",
    "sessions_df": "we0nb.notebook.frames",
    "messages_df": "we0nb.notebook.frames",
    "parts_df": "we0nb.notebook.frames",
    "tool_calls_df": "we0nb.notebook.frames",
    "session_summary": "we0nb.notebook.frames",
    "expand_json": "we0nb.notebook.frames",
    "plot_timeline": "we0nb.notebook.plots",
    "plot_tools": "we0nb.notebook.plots",
    "BatchResult": "we0nb.batch",
    "batches_df": "we0nb.notebook.batch_frames",
    "batch_df": "we0nb.notebook.batch_frames",
}


def load_ipython_extension(ipython):  # `%load_ext we0nb` registers the %%we0 cell magic
    """IPython's hook for ``%load_ext we0nb``: registers the ``%%we0`` cell magic."""
    from .notebook.magics import load_ipython_extension as load

    load(ipython)


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'we0nb' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once imported, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
