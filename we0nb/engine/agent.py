"""We0Agent: the thin façade over the loop — build_request, stream, invoke, transcript."""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Awaitable, Callable, Optional, Sequence

from pydantic import PydanticUserError, TypeAdapter

from ..messages import Session, ToolPart, Transcript
from ..models.base import Model, ToolSchema
from ..models.pricing import prefetch as prefetch_prices
from ..persistence.base import Persistence
from ..persistence.memory import MemoryPersistence
from ..tools import AnyToolDefinition, ToolDefinition, tool as make_tool
from . import approval as _approval
from . import questions as _questions
from . import fork as _fork
from . import revert as _revert
from .output import prompted_instructions, resolve_output_mode
from .events import Event
from .run import Run
from .request import RunRequest, RunResult, UserInput, build_request, check_session_id
from .toolset import ToolSource, ToolTable, Toolset, split_tools

__all__ = ["We0Agent", "use_batch_runner"]

#: how :meth:`We0Agent.batch` runs a batch: the batch package builds on the engine, never the
#: reverse, so the package that composes them (``we0nb/__init__.py``) connects it
_BATCH_RUNNER: Optional[Callable[..., Awaitable[Any]]] = None


def use_batch_runner(runner: Callable[..., Awaitable[Any]]) -> None:
    """Connect :meth:`We0Agent.batch` to the batch package (called once, by ``import we0nb``)."""
    global _BATCH_RUNNER
    _BATCH_RUNNER = runner


class We0Agent:
    """An LLM agent whose every message and part is persisted as it happens.

    ``model`` streams replies; ``tools`` are :func:`~we0nb.tool` definitions (plain
    functions are wrapped with the default, safe policy: side effects) and MCP servers
    (:class:`~we0nb.MCPServer`, each contributing its tools once connected); ``persistence``
    defaults to a fresh :class:`MemoryPersistence`. ``output_type`` asks for structured
    output (then only :meth:`invoke` can be used); ``output_mode`` says how: ``"tool"``,
    ``"native"`` or ``"prompted"`` (None: the model's own ``output_mode``), see
    :mod:`we0nb.engine.output`. ``flush_interval`` bounds how much
    streamed text a crash can lose (seconds). ``compaction_threshold`` (share of
    ``model.context_window``, default 0.8; None turns compaction off) and
    ``compaction_prompt`` configure compaction (see :mod:`we0nb.engine.compaction`).
    ``tracer_provider`` (an OpenTelemetry ``TracerProvider``; None: the global one, if one is
    configured) receives the runs' spans, with messages, tool arguments and results only when
    ``capture_content`` (see :mod:`we0nb.telemetry` and docs/tracing.md).
    """

    def __init__(
        self,
        model: Model,
        tools: Sequence[Any] = (),
        *,
        persistence: Optional[Persistence] = None,
        system_prompt: Optional[str] = None,
        output_type: Any = None,
        output_tool_name: str = "final_result",
        output_retries: int = 3,
        output_mode: Optional[str] = None,
        max_steps: int = 50,
        flush_interval: float = 0.25,
        compaction_threshold: Optional[float] = 0.8,
        compaction_prompt: Optional[str] = None,
        tracer_provider: Any = None,
        capture_content: bool = False,
    ):
        if not isinstance(model, Model):
            raise TypeError(
                f"We0Agent(model): expected a we0nb model (ScriptedModel, FunctionModel, OpenAIChatModel, "
                f"or a Model subclass), got {type(model).__name__}."
            )
        if persistence is None:
            persistence = MemoryPersistence()
        elif not isinstance(persistence, Persistence):
            raise TypeError(_not_a_persistence(persistence))
        _check_options(max_steps, output_retries, flush_interval, compaction_threshold, compaction_prompt)
        _check_texts(system_prompt, output_tool_name)
        _check_tracing(tracer_provider, capture_content)
        self.model = model
        static, sources = _tool_table(tools)
        if output_type is not None and output_tool_name in static:
            raise ValueError(f"A tool is named {output_tool_name!r}, which is reserved for structured output; "
                             "rename it or pass output_tool_name=.")
        self.persistence = persistence
        self.system_prompt = system_prompt
        self.output_type = output_type
        self.output_tool_name = output_tool_name
        self.output_retries = output_retries
        self.max_steps = max_steps
        self.flush_interval = float(flush_interval)
        #: compact when a step's input tokens pass this share of model.context_window (None: off)
        self.compaction_threshold = None if compaction_threshold is None else float(compaction_threshold)
        self.compaction_prompt = compaction_prompt
        #: where the runs' spans go (None: the global OpenTelemetry provider, if configured)
        self.tracer_provider = tracer_provider
        #: whether spans carry message content, tool arguments and results
        self.capture_content = capture_content
        prefetch_prices(model)  # (genai-prices loads on a thread now, not on the loop at the first step)
        self.output_adapter: Optional[TypeAdapter[Any]] = None
        self.output_schema: dict[str, Any] = {}
        #: how structured output is asked for: "tool", "native" or "prompted" (see we0nb.engine.output)
        self.output_mode = resolve_output_mode(output_mode, model)
        #: the instructions prompted mode adds to the system prompt ("" otherwise)
        self.output_prompt = ""
        output_entry = None
        if output_type is not None:
            self.output_adapter, self.output_schema = _output_schema(output_type)
            if self.output_mode == "tool":
                output_entry = ToolSchema(output_tool_name, "Call this tool to return your final answer as "
                                          "structured output.", self.output_schema)
            elif self.output_mode == "prompted":
                self.output_prompt = prompted_instructions(self.output_schema)
        #: the Python tools and the tool sources (MCP servers); ``toolset.table`` is the current table
        #: (schemas computed once per change: JSON Schema generation is slow)
        self.toolset = Toolset(tuple(static.values()), sources, output_entry)

    @property
    def tools(self) -> tuple[AnyToolDefinition, ...]:
        """The tools as last listed (an MCP server's appear once it is connected)."""
        return self.toolset.table.tools

    @property
    def tools_by_name(self) -> dict[str, AnyToolDefinition]:
        return self.toolset.table.by_name

    @property
    def tool_schemas(self) -> tuple[ToolSchema, ...]:
        """What a model request lists (the structured-output tool included)."""
        return self.toolset.table.schemas

    async def tool_table(self) -> ToolTable:
        """The current tools, connecting the agent's MCP servers first if needed."""
        return await self.toolset.refresh()

    # ------------------------------------------------------------------ lifetime

    async def aclose(self) -> None:
        """Close the agent's MCP servers (their processes end; they start again if used again).

        The persistence is left open: it may be shared (close it with ``persistence.close()``).
        """
        await self.toolset.aclose()

    async def __aenter__(self) -> "We0Agent":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return (f"We0Agent(model={self.model.model_id!r}, tools={[t.name for t in self.tools]}, "
                f"persistence={self.persistence!r})")

    # ------------------------------------------------------------------ entry points

    def build_request(self, *, abort: Optional[asyncio.Event] = None, mode: str = "prompt",
                      session_id: Optional[str] = None,
                      messages: Optional[Sequence[UserInput]] = None) -> RunRequest:
        """Validate a run and return it, without running anything."""
        return build_request(abort=abort, mode=mode, session_id=session_id, messages=messages)

    def stream(self, *, abort: Optional[asyncio.Event] = None, mode: str = "prompt",
               session_id: Optional[str] = None,
               messages: Optional[Sequence[UserInput]] = None) -> AsyncIterator[Event]:
        """Run and yield event dicts (see :mod:`we0nb.engine.events`). Validates eagerly."""
        if self.output_type is not None:
            raise ValueError(
                "stream() cannot be used when the agent has a structured output type "
                f"(output_type={self.output_type!r}); use invoke(), which returns it as result.output."
            )
        request = self.build_request(abort=abort, mode=mode, session_id=session_id, messages=messages)
        return Run(self, request, structured=False).events()

    async def invoke(self, *, abort: Optional[asyncio.Event] = None, mode: str = "prompt",
                     session_id: Optional[str] = None,
                     messages: Optional[Sequence[UserInput]] = None) -> RunResult:
        """Run to the end and return the :class:`RunResult` (raises CancelledError on abort)."""
        request = self.build_request(abort=abort, mode=mode, session_id=session_id, messages=messages)
        return await self.run_request(request)

    async def run_request(self, request: RunRequest) -> RunResult:
        """Run an already-built request to its end."""
        run = Run(self, request, structured=self.output_type is not None)
        async for _ in run.events():
            pass
        assert run.result is not None
        return run.result

    def stream_request(self, request: RunRequest) -> AsyncIterator[Event]:
        """Stream an already-built request (the notebook panel uses this)."""
        if self.output_type is not None:
            raise ValueError("stream_request() cannot be used with output_type; use run_request().")
        return Run(self, request, structured=False).events()

    async def transcript(self, session_id: str, *, include_reverted: bool = False) -> Transcript:
        """The persisted history of ``session_id`` (``.session`` is None when it does not exist).

        Messages hidden by a revert are left out; with ``include_reverted=True`` every message
        is kept and carries ``reverted`` (True for the hidden ones).
        """
        check_session_id(session_id)
        return _revert.mark_transcript(await self.persistence.load_transcript(session_id), include_reverted)

    # ------------------------------------------------------------------ batches

    async def batch(self, prompts: Any, *, name: Optional[str] = None, concurrency: int = 8,
                    abort: Optional[asyncio.Event] = None, progress: bool = True,
                    session_ids: Optional[Sequence[str]] = None, max_failures: Optional[int] = None,
                    retry_failed: bool = False, max_cost: Optional[float] = None) -> Any:
        """Run many prompts, each as a session of its own, ``concurrency`` at a time; a ``BatchResult``.

        The batch is persisted under ``name`` (generated when omitted): the same call again
        continues it (ended items skipped, unfinished ones resumed), and the same call in other
        processes on the same database shares the work. ``abort`` stops it promptly (no raise);
        ``max_failures`` stops it after that many failed items; ``retry_failed`` resumes failed
        items too; ``max_cost`` (USD) claims no new item once the batch's model calls so far cost
        that much (``batch.stopped == "max_cost"``). See :mod:`we0nb.batch` and the README's
        "Batch runs".
        """
        if _BATCH_RUNNER is None:  # pragma: no cover - ``import we0nb`` sets it
            raise RuntimeError("batch runs are not available: import we0nb (it connects them).")
        return await _BATCH_RUNNER(self, prompts, name=name, concurrency=concurrency, abort=abort,
                                   progress=progress, session_ids=session_ids, max_failures=max_failures,
                                   retry_failed=retry_failed, max_cost=max_cost)

    # ------------------------------------------------------------------ approvals

    async def pending_approvals(self, session_id: str) -> list[ToolPart]:
        """The calls of ``session_id`` that await a person's decision, in call order."""
        return await _approval.pending_approvals(self.persistence, session_id)

    async def approve(self, session_id: str, call_id: str, input: Optional[dict[str, Any]] = None) -> ToolPart:
        """Approve an awaiting call (durable when this returns); ``mode="resume"`` then runs it.

        ``input``: corrected arguments, validated against the tool's schema at once (ValueError,
        and no decision recorded, when invalid); the model's own are kept. Raises
        SessionBusyError while a run holds the session, ValueError for an unknown call or one
        not awaiting approval (deciding twice: the first decision stands).
        """
        tools = (await self.toolset.refresh()).by_name if input is not None else self.tools_by_name
        return await _approval.decide(self.persistence, tools, session_id, call_id, approve=True, input=input)

    async def deny(self, session_id: str, call_id: str, reason: Optional[str] = None) -> ToolPart:
        """Deny an awaiting call (durable when this returns): it never runs; the model is told,
        with ``reason``, on ``mode="resume"``. Errors as for :meth:`approve`."""
        return await _approval.decide(self.persistence, self.tools_by_name, session_id, call_id,
                                      approve=False, reason=reason)

    # ------------------------------------------------------------------ fork

    # ------------------------------------------------------------------ questions (MCP elicitation)

    async def pending_questions(self, session_id: str) -> list[ToolPart]:
        """The running calls whose question (an MCP server's elicitation) awaits a person's
        answer, in call order; the question is ``state.metadata["questions"][-1]``."""
        return await _questions.pending_questions(self.persistence, session_id)

    async def answer(self, session_id: str, call_id: str, content: Optional[dict[str, Any]] = None, *,
                     action: str = "accept") -> dict[str, Any]:
        """Answer the question call ``call_id`` waits on: ``action`` is ``"accept"`` (a form's
        ``content``, its defaults filled in), ``"decline"`` or ``"cancel"``. An answer that does not
        match the requested schema raises ``ValueError`` and nothing is sent or recorded; so does a
        question nobody waits for any more. Returns the question as answered."""
        return await _questions.answer_question(self.persistence, session_id, call_id, action, content)

    async def fork(self, session_id: str, *, at: Optional[str] = None,
                   new_session_id: Optional[str] = None) -> str:
        """Copy ``session_id``'s visible history up to and including message ``at`` (None: all)
        into a new session and return its id; nothing is executed and no model is called.

        Unfinished calls end interrupted (reason ``"fork"``); ``mode="resume"`` on the fork then
        runs its turn on, with this agent's (or any agent's) model and tools. The new session's
        ``forked_from`` / ``forked_at`` record the lineage. ValueError, writing nothing, for an
        unknown session, an ``at`` that is not a visible message, or an existing ``new_session_id``.
        """
        return await _fork.fork_session(self.persistence, session_id, at=at, new_session_id=new_session_id)

    # ------------------------------------------------------------------ revert

    async def revert(self, session_id: str, message_id: str) -> Session:
        """Hide ``message_id`` and every later message (from the model and the transcript).

        The next ``prompt`` deletes them for good; ``resume`` leaves the revert in place and
        sees only what is before it; :meth:`unrevert` brings them back. Refused
        (SessionBusyError) while a run holds the session.
        """
        return await _revert.revert_session(self.persistence, session_id, message_id)

    async def unrevert(self, session_id: str) -> Session:
        """Undo the session's revert: the hidden messages are visible again."""
        return await _revert.unrevert_session(self.persistence, session_id)


# --------------------------------------------------------------------------- construction checks


def _tool_table(tools: Sequence[Any]) -> tuple[dict[str, AnyToolDefinition], list[ToolSource]]:
    """The agent's Python tools (plain functions wrapped with the safe default policy) by unique
    name, and its tool sources (MCP servers, each given once)."""
    if isinstance(tools, (str, bytes)) or not isinstance(tools, Sequence):
        raise TypeError("We0Agent(tools=...): expected a list of tools made with @tool (or MCP servers).")
    given, sources = split_tools(tools)
    if len({id(s) for s in sources}) != len(sources):
        raise ValueError("We0Agent(tools=...): the same MCP server is listed twice; list it once.")
    defs: list[AnyToolDefinition] = []
    for t in given:
        if isinstance(t, ToolDefinition):
            defs.append(t)
        elif callable(t):
            defs.append(make_tool(t))
        else:
            raise TypeError(f"We0Agent(tools=...): {t!r} is not a tool; decorate a function with @tool "
                            "(or pass an MCPServer).")
    by_name: dict[str, AnyToolDefinition] = {}
    for d in defs:
        if d.name in by_name:
            raise ValueError(f"We0Agent(tools=...): two tools are named {d.name!r}; tool names must be unique.")
        by_name[d.name] = d
    return by_name, sources


def _check_options(max_steps: Any, output_retries: Any, flush_interval: Any, compaction_threshold: Any,
                   compaction_prompt: Any) -> None:
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
        raise ValueError("We0Agent(max_steps=...): expected an integer >= 1.")
    if isinstance(output_retries, bool) or not isinstance(output_retries, int) or output_retries < 0:
        raise ValueError("We0Agent(output_retries=...): expected an integer >= 0.")
    if isinstance(flush_interval, bool) or not isinstance(flush_interval, (int, float)) or flush_interval < 0:
        raise ValueError("We0Agent(flush_interval=...): expected seconds >= 0 (0 writes every delta).")
    if compaction_threshold is not None and (
            isinstance(compaction_threshold, bool) or not isinstance(compaction_threshold, (int, float))
            or not 0 < compaction_threshold <= 1):
        raise ValueError("We0Agent(compaction_threshold=...): expected a share of the context window in "
                         "(0, 1], e.g. 0.8, or None to turn compaction off.")
    if compaction_prompt is not None and (not isinstance(compaction_prompt, str) or not compaction_prompt.strip()):
        raise ValueError("We0Agent(compaction_prompt=...): expected a non-empty string or None.")


def _check_texts(system_prompt: Any, output_tool_name: Any) -> None:
    if system_prompt is not None and not isinstance(system_prompt, str):
        raise TypeError(f"We0Agent(system_prompt=...): expected a string or None, got {type(system_prompt).__name__}"
                        " (join several instructions into one string).")
    if not isinstance(output_tool_name, str) or not output_tool_name.strip():
        raise TypeError(f"We0Agent(output_tool_name=...): expected a non-empty string, got {output_tool_name!r}.")


def _check_tracing(tracer_provider: Any, capture_content: Any) -> None:
    if tracer_provider is not None and not callable(getattr(tracer_provider, "get_tracer", None)):
        raise TypeError("We0Agent(tracer_provider=...): expected an OpenTelemetry TracerProvider (something with "
                        f"get_tracer()), got {type(tracer_provider).__name__}.")
    if not isinstance(capture_content, bool):
        raise TypeError(f"We0Agent(capture_content=...): expected True or False, got {capture_content!r}.")


def _output_schema(output_type: Any) -> tuple[TypeAdapter[Any], dict[str, Any]]:
    expected = ("We0Agent(output_type=...): expected a pydantic model, dataclass or TypedDict "
                "(something that is a JSON object)")
    try:
        adapter: TypeAdapter[Any] = TypeAdapter(output_type)
        schema = adapter.json_schema()
    except (PydanticUserError, TypeError) as e:  # (5, an object, a class pydantic cannot describe)
        raise TypeError(f"{expected}, got {output_type!r} ({type(e).__name__}).") from None
    if schema.get("type") != "object":
        raise TypeError(f"{expected}.")
    return adapter, schema


def _not_a_persistence(store: Any) -> str:
    """Why ``store`` is refused; a store of one's own with the methods is told how to declare itself."""
    from ..persistence.base import LeaseStore, SessionStore

    name = type(store).__name__
    said = (f"We0Agent(persistence=...): expected MemoryPersistence(), SqlPersistence(url) or an instance of a "
            f"we0nb.Persistence subclass, got {name}")
    if isinstance(store, SessionStore) and isinstance(store, LeaseStore):
        return (f"{said}, which has the methods but does not subclass it: declare "
                f"`class {name}(..., we0nb.Persistence)` (see docs/stores.md).")
    return said + "."
