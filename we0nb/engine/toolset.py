"""The tools an agent offers at a given moment: its Python tools plus what its tool sources list.

A *tool source* (an MCP server) contributes tools that exist only once it is connected and
that may change while it runs (``notifications/tools/list_changed``), so the agent's tool
table is not fixed at construction. :class:`Toolset` owns the current :class:`ToolTable`
(tools by name, the schemas a model request lists, the policies recovery needs); a run asks
it for the table at its start and before each step. Without sources the table never changes
and asking costs nothing: the run reads ``toolset.table`` and never awaits.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Optional, Protocol, Sequence, runtime_checkable

from ..models.base import ToolSchema
from ..tools import AnyToolDefinition, ToolPolicy

log = logging.getLogger("we0nb.mcp")

__all__ = ["ToolSource", "ToolTable", "Toolset"]


@runtime_checkable
class ToolSource(Protocol):
    """Something in ``tools=[...]`` that contributes a changing set of tools (an MCP server)."""

    #: how errors name it, e.g. "MCP server 'files'"
    label: str

    async def ensure_tools(self) -> Sequence[AnyToolDefinition]:
        """Its current tools, connecting first if needed. Returns the *same* sequence object as
        long as the tools have not changed (the toolset rebuilds its table only on a change)."""
        ...

    async def aclose(self) -> None:
        """Disconnect (stop what it started); it connects again when used again."""
        ...


@dataclass(frozen=True)
class ToolTable:
    """One consistent view of the agent's tools: by name, as schemas, and their policies."""

    tools: tuple[AnyToolDefinition, ...]
    by_name: dict[str, AnyToolDefinition]
    #: what every model request lists (the structured-output tool included)
    schemas: tuple[ToolSchema, ...]
    #: tool name -> policy, as recovery needs it (the structured-output tool included)
    policies: dict[str, ToolPolicy]


class Toolset:
    """The agent's Python tools and tool sources; :attr:`table` is the current :class:`ToolTable`.

    ``output`` is the structured-output tool (its schema is listed, its name reserved).
    """

    def __init__(self, static: Sequence[AnyToolDefinition], sources: Sequence[ToolSource],
                 output: Optional[ToolSchema] = None) -> None:
        self.static = tuple(static)
        self.sources = tuple(sources)
        self.output = output
        self._lists: tuple[Sequence[AnyToolDefinition], ...] = tuple(() for _ in self.sources)
        self._static_schemas = tuple(ToolSchema(t.name, t.description, t.json_schema()) for t in self.static)
        self.table = self._build(self._lists)

    async def refresh(self) -> ToolTable:
        """The current table: each source is asked for its tools (connected on first use); the
        table is rebuilt only when a source's list changed. Name clashes raise ValueError."""
        if not self.sources:
            return self.table
        lists = tuple([await s.ensure_tools() for s in self.sources])
        if any(a is not b for a, b in zip(lists, self._lists)):
            first = not any(self._lists)
            # (a clash in the lists of a first connection is the agent's setup: an error; one a server
            # made later, adding a tool while it runs, hides the newcomer: the run goes on)
            self.table = self._build(lists, None if first else self._owner_of)
            self._lists = lists
        return self.table

    async def aclose(self) -> None:
        """Close every source (each one even when another fails; the first error is raised)."""
        first: Optional[BaseException] = None
        for s in self.sources:
            try:
                await s.aclose()
            except Exception as e:  # pragma: no cover - sources close quietly
                first = first or e
        if first is not None:  # pragma: no cover
            raise first

    def _build(self, lists: Sequence[Sequence[AnyToolDefinition]],
               before: Optional[dict[str, str]] = None) -> ToolTable:
        """The table of the static tools and the sources' lists. Two tools of one name raise
        ValueError — unless ``before`` (who gave each tool until now) is given: then the tool that
        was there before stays, the new one is hidden, and a warning says so."""
        by_name: dict[str, AnyToolDefinition] = {t.name: t for t in self.static}
        owner: dict[str, str] = {t.name: "a Python tool" for t in self.static}
        given: dict[str, ToolSchema] = {}
        for source, tools in zip(self.sources, lists):
            for t in tools:
                if t.name in by_name:
                    if before is None:
                        raise ValueError(_clash(t.name, owner[t.name], source.label))
                    kept, hidden = ((source.label, owner[t.name]) if before.get(t.name) == source.label
                                    else (owner[t.name], source.label))
                    log.warning("%s now offers a tool named %r, as %s does: the one of %s is hidden from the "
                                "model. Give the MCP server a prefix (MCPServer.stdio(..., prefix='files_')) to "
                                "keep both.", _upper(hidden), t.name, kept, hidden)
                    if kept != source.label:
                        continue
                by_name[t.name] = t
                owner[t.name] = source.label
                given[t.name] = ToolSchema(t.name, t.description, t.json_schema())
        schemas = [*self._static_schemas, *given.values()]
        self._owner_of = owner  # (who gives each tool: what a later rebuild keeps on a clash)
        policies = {name: t.policy for name, t in by_name.items()}
        if self.output is not None:
            if self.output.name in by_name:
                raise ValueError(f"{_upper(owner[self.output.name])} has a tool named {self.output.name!r}, "
                                 "which is reserved for structured output; rename it, give its server a "
                                 "prefix=, or pass output_tool_name=.")
            schemas.append(self.output)
            policies[self.output.name] = ToolPolicy(side_effects=False)
        return ToolTable(tuple(by_name.values()), by_name, tuple(schemas), policies)


def _upper(label: str) -> str:
    """``label`` starting a sentence (``str.capitalize`` would lower the rest: 'Mcp server')."""
    return label[:1].upper() + label[1:]


def _clash(name: str, first: str, second: str) -> str:
    return (f"Two tools are named {name!r}: {first} and {second}; tool names must be unique. Give the MCP "
            f"server a prefix (e.g. MCPServer.stdio(..., prefix='files_')) so its tools are named "
            f"'files_{name}'.")


def split_tools(tools: Any) -> tuple[list[Any], list[ToolSource]]:
    """``tools=[...]`` split into tool definitions/functions and tool sources."""
    defs: list[Any] = []
    sources: list[ToolSource] = []
    for t in tools:
        (sources if isinstance(t, ToolSource) else defs).append(t)
    return defs, sources
