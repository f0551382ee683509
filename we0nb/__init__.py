"""we0nb — a Jupyter-first asyncio agent engine whose resume never repeats a side effect.

The names of SPEC.md are re-exported here; everything else lives in sub-packages.
"""

from __future__ import annotations

from .engine import RunRequest, RunResult, We0Agent, plan_recovery, user_message
from .errors import (
    CompactionError,
    ContextWindowExceeded,
    CorruptRecordError,
    ModelAuthenticationError,
    ModelProviderError,
    MaxStepsExceeded,
    ModelError,
    OutputValidationError,
    PersistenceError,
    SchemaVersionError,
    ScriptExhaustedError,
    SessionBusyError,
    We0Error,
)
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
from .models import FunctionModel, Model, ModelRequest, ScriptedModel, fail, output, reasoning, text, tool_call, usage
from .persistence import MemoryPersistence, Persistence
from .tools import AnyToolDefinition, ToolDefinition, ToolPolicy, tool

__version__ = "0.1.0"

__all__ = [
    "We0Agent", "RunRequest", "RunResult", "user_message", "plan_recovery",
    "MemoryPersistence", "SqlPersistence", "Persistence",
    "tool", "AnyToolDefinition", "ToolDefinition", "ToolPolicy",
    "Model", "ModelRequest", "ScriptedModel", "FunctionModel", "OpenAIChatModel",
    "text", "reasoning", "tool_call", "output", "usage", "fail",
    "Session", "UserMessage", "AssistantMessage", "MessageError", "Usage", "Transcript", "MessageWithParts",
    "Part", "TextPart", "ReasoningPart", "ToolPart", "StepStartPart", "StepFinishPart", "CompactionPart",
    "ToolState", "ToolStatePending", "ToolStateRunning", "ToolStateCompleted", "ToolStateError",
    "We0Error", "SessionBusyError", "MaxStepsExceeded", "ModelError", "OutputValidationError",
    "ScriptExhaustedError", "PersistenceError", "CorruptRecordError", "SchemaVersionError",
    "ModelProviderError", "ModelAuthenticationError", "ContextWindowExceeded", "CompactionError",
    "show", "sessions_df", "messages_df", "parts_df", "tool_calls_df", "session_summary", "expand_json",
    "plot_timeline", "plot_tools",
]

_LAZY = {
    "SqlPersistence": ("we0nb.persistence.sql", "SqlPersistence"),
    "OpenAIChatModel": ("we0nb.models.openai", "OpenAIChatModel"),
    "show": ("we0nb.notebook.live", "show"),
    "sessions_df": ("we0nb.notebook.frames", "sessions_df"),
    "messages_df": ("we0nb.notebook.frames", "messages_df"),
    "parts_df": ("we0nb.notebook.frames", "parts_df"),
    "tool_calls_df": ("we0nb.notebook.frames", "tool_calls_df"),
    "session_summary": ("we0nb.notebook.frames", "session_summary"),
    "expand_json": ("we0nb.notebook.frames", "expand_json"),
    "plot_timeline": ("we0nb.notebook.plots", "plot_timeline"),
    "plot_tools": ("we0nb.notebook.plots", "plot_tools"),
}


def load_ipython_extension(ipython):  # `%load_ext we0nb` registers the %%we0 cell magic
    from .notebook.magics import load_ipython_extension as load

    load(ipython)


def __getattr__(name: str):
    # optional parts are imported on first use, so `import we0nb` stays light
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        return getattr(importlib.import_module(mod), attr)
    raise AttributeError(f"module 'we0nb' has no attribute {name!r}")
