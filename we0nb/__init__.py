"""we0nb — a Jupyter-first asyncio agent engine whose resume never repeats a side effect.

The names of SPEC.md are re-exported here; everything else lives in sub-packages. Names whose
module is heavy (SQLAlchemy, pandas, Jupyter, a provider's client) are imported on first use
(:mod:`we0nb._lazy`), so ``import we0nb`` stays light. This package is also where the layers
are composed: the engine never imports the batch package, so its ``We0Agent.batch`` is
connected here.
"""

from __future__ import annotations

import sys as _sys
from typing import TYPE_CHECKING, Any as _Any, Optional as _Optional

from ._extras import MissingExtraError
from ._lazy import lazy_names as _lazy_names
from ._plugins import use_display as _use_display
from .engine import RunRequest, RunResult, We0Agent, plan_recovery, user_message
from .engine.replay import ReplayModel
from .engine.agent import use_batch_runner as _use_batch_runner
from .engine.observe import use_run_observers as _use_run_observers
from .engine.events import Event
from .errors import (
    CompactionError,
    ContextWindowExceeded,
    CorruptRecordError,
    LeaseLostError,
    MaxStepsExceeded,
    MCPServerError,
    ModelAuthenticationError,
    ModelError,
    ModelProviderError,
    OutputValidationError,
    PersistenceError,
    ReplayMismatchError,
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
from .models import FunctionModel, Model, ModelRequest, ScriptedModel
from .persistence import MemoryPersistence, Persistence
from .testing import output, text, tool_call  # SPEC names them here too; they belong to we0nb.testing
from .tools import (AnyToolDefinition, Reconciled, ToolContext, ToolDefinition, ToolError, ToolPolicy, ToolReturn,
                    tool)

if TYPE_CHECKING:  # the lazy names, for IDEs and type checkers
    from .batch import BatchResult
    from .mcp import MCPServer
    from .models.anthropic import AnthropicModel
    from .models.local import local_model
    from .models.openai import OpenAIChatModel
    from .notebook.batch_frames import batch_df, batches_df
    from .batch.judge import judge
    from .batch.score import Score, scorer
    from .notebook.compare import compare, compare_df
    from .notebook.score_frames import experiments_df, plot_experiments, scores_df
    from .notebook.frames import expand_json, messages_df, parts_df, session_summary, sessions_df, tool_calls_df
    from .notebook.showing import show
    from .notebook.panel import RunPanel
    from .notebook.plots import plot_timeline, plot_tools
    from .persistence.sql import SqlPersistence


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("we0nb")
    except PackageNotFoundError:  # a checkout on sys.path, not installed
        return "0+unknown"


__version__ = _version()

__all__ = [
    # running an agent
    "We0Agent", "RunRequest", "RunResult", "Event", "user_message", "plan_recovery",
    # stores
    "MemoryPersistence", "SqlPersistence", "Persistence",
    # tools
    "tool", "AnyToolDefinition", "ToolDefinition", "ToolPolicy", "ToolContext", "Reconciled", "ToolError",
    "ToolReturn",
    # models (the script builders text, tool_call, output… live in we0nb.testing)
    "Model", "ModelRequest", "ScriptedModel", "FunctionModel", "ReplayModel", "OpenAIChatModel", "AnthropicModel", "local_model",
    # the data model
    "Session", "UserMessage", "AssistantMessage", "MessageError", "Usage", "Transcript", "MessageWithParts",
    "Part", "TextPart", "ReasoningPart", "ToolPart", "StepStartPart", "StepFinishPart", "CompactionPart",
    "ToolState", "ToolStatePending", "ToolStateRunning", "ToolStateCompleted", "ToolStateError",
    # errors
    "We0Error", "SessionBusyError", "LeaseLostError", "MaxStepsExceeded", "ModelError", "OutputValidationError",
    "ScriptExhaustedError", "ReplayMismatchError", "PersistenceError", "CorruptRecordError", "SchemaVersionError",
    "ModelProviderError", "ModelAuthenticationError", "ContextWindowExceeded", "CompactionError",
    "MissingExtraError", "MCPServer", "MCPServerError",
    # the notebook: live view, panel, frames, plots
    "show", "RunPanel", "sessions_df", "messages_df", "parts_df", "tool_calls_df", "session_summary",
    "expand_json", "plot_timeline", "plot_tools",
    # experiments: compare sessions, score batches
    "compare_df", "compare", "Score", "scorer", "judge", "scores_df", "experiments_df", "plot_experiments",
    # batches
    "BatchResult", "batches_df", "batch_df",
    "load_ipython_extension",
]

#: names imported on first use, and the module of each
_LAZY = {
    "SqlPersistence": "we0nb.persistence.sql",
    "OpenAIChatModel": "we0nb.models.openai",
    "AnthropicModel": "we0nb.models.anthropic",
    "MCPServer": "we0nb.mcp",
    "local_model": "we0nb.models.local",
    "show": "we0nb.notebook.showing",
    "RunPanel": "we0nb.notebook.panel",
    "sessions_df": "we0nb.notebook.frames",
    "messages_df": "we0nb.notebook.frames",
    "parts_df": "we0nb.notebook.frames",
    "tool_calls_df": "we0nb.notebook.frames",
    "session_summary": "we0nb.notebook.frames",
    "expand_json": "we0nb.notebook.frames",
    "plot_timeline": "we0nb.notebook.plots",
    "plot_tools": "we0nb.notebook.plots",
    "compare_df": "we0nb.notebook.compare",
    "compare": "we0nb.notebook.compare",
    "Score": "we0nb.batch.score",
    "scorer": "we0nb.batch.score",
    "judge": "we0nb.batch.judge",
    "scores_df": "we0nb.notebook.score_frames",
    "experiments_df": "we0nb.notebook.score_frames",
    "plot_experiments": "we0nb.notebook.score_frames",
    "BatchResult": "we0nb.batch",
    "batches_df": "we0nb.notebook.batch_frames",
    "batch_df": "we0nb.notebook.batch_frames",
}
#: script builders still read from here, with a DeprecationWarning (``text``, ``tool_call`` and
#: ``output``, which SPEC names here, are imported above without one)
_MOVED = {"reasoning": "we0nb.testing", "usage": "we0nb.testing", "fail": "we0nb.testing"}

__getattr__, __dir__ = _lazy_names(__name__, globals(), _LAZY, _MOVED)


def load_ipython_extension(ipython: _Any) -> None:  # `%load_ext we0nb` registers the %%we0 cell magic
    """IPython's hook for ``%load_ext we0nb``: registers the ``%%we0`` cell magic."""
    from .notebook.magics import load_ipython_extension as load

    load(ipython)


async def _run_batch(agent: _Any, prompts: _Any, **options: _Any) -> _Any:
    from .batch import run_batch  # (imported on first use: a batch needs the notebook's frames later)
    from .batch.observe import use_batch_observers

    use_batch_observers(_trace_batch)  # (once; the batch package is imported here, not by `import we0nb`)
    return await run_batch(agent, prompts, **options)


_use_batch_runner(_run_batch)


def _display(obj: _Any) -> dict[str, str]:
    """The data model's rich display (it cannot import the notebook layer above it)."""
    from .notebook.html import mimebundle

    return mimebundle(obj)


_use_display(_display)


# tracing (we0nb.telemetry, the `otel` extra): imported only once OpenTelemetry is — a provider
# given to the agent, or `opentelemetry.trace` imported by whoever configures one — so a run
# without it costs one check
def _traced(agent: _Any) -> bool:
    return agent.tracer_provider is not None or "opentelemetry.trace" in _sys.modules


def _trace_run(agent: _Any, request: _Any) -> _Optional[_Any]:
    if not _traced(agent):
        return None
    from .telemetry import run_observer

    return run_observer(agent, request)


def _trace_batch(agent: _Any, name: str, items: int, concurrency: int) -> _Optional[_Any]:
    if not _traced(agent):
        return None
    from .telemetry import batch_observer

    return batch_observer(agent, name, items, concurrency)


_use_run_observers(_trace_run)
