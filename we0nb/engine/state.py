"""What the parts of one run share: the history so far, the writer, abort, ids, totals.

The step processor, the tool executor, recovery and compaction all work through this
object — the run's small interface — and never through each other's attributes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Protocol

from .._ids import IdSequence, now
from ..messages import MessageTime, MessageWithParts, PartTime, TextPart, Usage, UserMessage, assembled, snapshot
from ..models.base import Model, ModelRequest, ToolSchema
from ..persistence.base import Persistence
from ..tools import AnyToolDefinition, ToolPolicy
from .abort import AbortScope
from .observe import RunObserver
from .history import HistoryCache
from .request import RunRequest
from .toolset import ToolTable, Toolset
from .writer import Writer

__all__ = ["RunState", "AgentSettings"]


class AgentSettings(Protocol):
    """What a run reads of its agent (``We0Agent`` is one): the run never imports the façade."""

    model: Model
    persistence: Persistence
    toolset: Toolset
    system_prompt: Optional[str]
    output_type: Any
    output_tool_name: str
    output_adapter: Any
    output_schema: dict[str, Any]
    output_mode: str
    output_prompt: str
    output_retries: int
    max_steps: int
    flush_interval: float
    compaction_threshold: Optional[float]
    compaction_prompt: Optional[str]


@dataclass
class RunState:
    agent: AgentSettings
    request: RunRequest
    writer: Writer
    scope: AbortScope
    #: the agent's tools for this step (MCP servers' tools can change between steps)
    tools: ToolTable
    ids: IdSequence = field(default_factory=IdSequence)
    messages: list[MessageWithParts] = field(default_factory=list)
    history: HistoryCache = field(default_factory=HistoryCache)
    steps: int = 0
    usage: Usage = field(default_factory=Usage)
    #: the cost of the run's model calls so far, USD (None once one of them has no known price)
    cost: Optional[float] = 0.0
    output: Any = None
    has_output: bool = False
    #: what a stream event carries of a part or message: a copy (safe to keep, the public
    #: contract), or the live object for a consumer of this package that reads it at once
    snap: Callable[[Any], Any] = snapshot
    #: who watches the run from the side (tracing), if anyone (see :mod:`.observe`)
    observer: Optional["RunObserver"] = None
    _parent: Optional[str] = None

    @property
    def session_id(self) -> str:
        return self.request.session_id

    def load(self, messages: list[MessageWithParts], history: HistoryCache) -> None:
        """Start from the persisted ``messages``; new ids sort after every stored one."""
        self.messages = messages
        self.history = history
        if messages:
            last = messages[-1]
            self.ids.seed([last.info.id, *(p.id for p in last.parts)])

    # ------------------------------------------------------------------ the history

    def last_assistant(self) -> Optional[MessageWithParts]:
        for m in reversed(self.messages):
            if m.info.role == "assistant":
                return m
        return None

    def parent_id(self) -> Optional[str]:
        """The user message this turn answers (found once, then kept as messages are written)."""
        if self._parent is None:
            self._parent = next((m.info.id for m in reversed(self.messages) if m.info.role == "user"), None)
        return self._parent

    async def refresh_tools(self) -> None:
        """Ask the toolset for its current table (only agents with MCP servers ever wait here)."""
        toolset = self.agent.toolset
        if toolset.sources:
            self.tools = await self.scope.wait(toolset.refresh())

    def policies(self) -> dict[str, ToolPolicy]:
        return self.tools.policies

    def approval_reason(self, tool_name: str, input: dict[str, Any]) -> Optional[str]:
        """Why a call needs a person's approval before it runs (None: it does not)."""
        t = self.tools.by_name.get(tool_name)
        return t.policy.approval_reason(tool_name, input) if t is not None else None

    def blocks(self, tool_name: str) -> bool:
        t = self.tools.by_name.get(tool_name)
        return bool(t and t.policy.blocks_on_error)

    def model_request(self) -> ModelRequest:
        agent = self.agent
        mode = agent.output_mode if agent.output_type is not None else None
        system = agent.system_prompt
        if agent.output_prompt:  # prompted structured output: the schema goes with the instructions
            system = f"{system}\n\n{agent.output_prompt}" if system else agent.output_prompt
        return ModelRequest(
            messages=self.history.build(self.messages),
            tools=list(self.tools.schemas),
            system=system,
            output_tool=agent.output_tool_name if mode == "tool" else None,
            output_mode=mode,  # type: ignore[arg-type]
            output_schema=agent.output_schema if mode is not None else None,
        )

    # ------------------------------------------------------------------ user messages

    def user_message(self, text: str, *, synthetic: bool = False) -> MessageWithParts:
        """A new user message (with its text part), not yet written."""
        t = now()
        sid = self.session_id
        info = UserMessage(id=self.ids("msg"), session_id=sid, time=MessageTime(created=t))
        part = TextPart(id=self.ids("prt"), session_id=sid, message_id=info.id, text=text,
                        time=PartTime(start=t, end=t), synthetic=synthetic)
        return assembled(MessageWithParts, info=info, parts=[part])

    def add_user_message(self, m: MessageWithParts) -> None:
        """``m`` is written: it joins the history and becomes the turn's parent."""
        self.messages.append(m)
        self._parent = m.info.id

    def hold_user_message(self, text: str) -> MessageWithParts:
        """A prompt's user message, held for the next commit (its first step's start); its
        event waits for that commit."""
        m = self.user_message(text)
        self.writer.hold(m.info, m.parts, m, [{"type": "user-message", "message": self.snap(m.info), "text": m.text}])
        self.add_user_message(m)
        return m

    async def append_user_message(self, text: str, *, synthetic: bool = False) -> MessageWithParts:
        """Write a user message (and its text part) and make it the turn's parent."""
        m = self.user_message(text, synthetic=synthetic)
        await self.writer.write(m.info, *m.parts, final=m)
        self.add_user_message(m)
        return m
