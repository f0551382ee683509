"""``resources/read`` as a read-only tool the user can enable (``MCPServer(resource_tool=True)``):
a result's resource links are only names to the model; with this tool it can read them.

Reading a resource has no side effect (MCP resources are data), so the tool is read-only:
recalled on resume. Text contents become the output (under a ``[resource uri, mime]`` line),
binary ones file attachments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ..messages import Attachment
from ..tools import ToolPolicy, ToolReturn
from .adapter import MCPTool, _MCPArguments, _validator
from .endpoint import Endpoint

__all__ = ["ResourceTool", "resource_tool", "resource_return", "RESOURCE_TOOL"]

RESOURCE_TOOL = "read_resource"
_SCHEMA = {"type": "object", "properties": {"uri": {"type": "string", "description": "The resource's URI."}},
           "required": ["uri"], "additionalProperties": False}


@dataclass(frozen=True)
class ResourceTool(MCPTool):
    """The server's ``resources/read``, as a tool (its ``remote_name`` is ``"resources/read"``)."""

    async def call(self, kwargs: dict[str, Any], context: Any = None,
                   returned: Any = None) -> Any:  # (``returned``: for sync tools; this one is async)
        assert self.server is not None
        return await self.server.read_resource(str(kwargs["uri"]))


def resource_tool(server: Endpoint, name: str) -> ResourceTool:
    async def read(uri: str) -> Any:
        return await server.read_resource(uri)

    return ResourceTool(name=name, function=read, input_model=_MCPArguments, is_async=True, server=server,
                        description=f"Read a resource of {server.label} by its URI (e.g. a link a tool returned).",
                        policy=ToolPolicy(side_effects=False), remote_name="resources/read",
                        input_schema=dict(_SCHEMA), policy_source="resources/read (read-only)",
                        validator=_validator(dict(_SCHEMA), server, "resources/read"))


def resource_return(result: Any) -> Any:
    """A ``ReadResourceResult`` as a tool return value (text as output, blobs as attachments)."""
    lines: list[str] = []
    attachments: list[Attachment] = []
    for c in result.contents or ():
        uri, mime = str(c.uri), getattr(c, "mime_type", None)
        suffix = f", {mime}" if mime else ""
        text: Optional[str] = getattr(c, "text", None)
        if text is not None:
            lines.append(f"[resource {uri}{suffix}]\n{text}")
        else:
            lines.append(f"[file {uri}{suffix}]")
            attachments.append(Attachment(type="file", uri=uri, mime_type=mime, data=getattr(c, "blob", None)))
    output = "\n".join(lines)
    return ToolReturn(output, tuple(attachments)) if attachments else output
