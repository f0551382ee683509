"""MCP tools as we0nb tool definitions: the policy their annotations earn, arguments checked
against the tool's ``inputSchema``, and results turned into output, JSON and attachments.

MCP says a client must treat tool annotations as untrusted unless it trusts the server, so
by default every MCP tool has side effects (interrupted on resume, never run twice). Only
with ``trust_annotations=True`` does ``readOnlyHint: true`` make a tool read-only (recalled
on resume) and ``idempotentHint: true`` make it idempotent (executed again with the same
idempotency key on resume, SPEC §11). ``policies=`` overrides both, per tool. Every call
carries its idempotency key in the request's ``_meta`` under :data:`IDEMPOTENCY_META_KEY`.
"""

from __future__ import annotations

import functools
import logging
import re
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Optional, Union

from pydantic import BaseModel, ConfigDict, ValidationError

from ..messages import Attachment
from ..tools import ToolDefinition, ToolError, ToolInputError, ToolPolicy, ToolReturn, parse_arguments
from .endpoint import Endpoint


__all__ = ["MCPTool", "PolicyOptions", "tool_policy", "make_tool", "to_return", "call_error",
           "IDEMPOTENCY_META_KEY", "hidden_reason"]

#: where a call's idempotency key travels in the ``tools/call`` request's ``_meta`` (SPEC §11)
IDEMPOTENCY_META_KEY = "io.we0nb/idempotency-key"

log = logging.getLogger("we0nb.mcp")

HINTS = ("read_only_hint", "destructive_hint", "idempotent_hint", "open_world_hint")


class _MCPArguments(BaseModel):
    """Placeholder input model: an MCP tool's arguments are checked against its JSON Schema."""

    model_config = ConfigDict(extra="allow")


@dataclass(frozen=True)
class MCPTool(ToolDefinition[Any]):
    """A tool of an MCP server. ``name`` is what the agent and the model see (``prefix`` +
    ``remote_name``); calls go to the server under ``remote_name``."""

    server: Optional[Endpoint] = None
    remote_name: str = ""
    input_schema: dict[str, Any] = field(default_factory=dict)
    #: the tool's annotations as the server sent them (hint name -> value, None when absent)
    annotations: dict[str, Any] = field(default_factory=dict)
    #: why the policy is what it is (shown in the policy table)
    policy_source: str = ""
    validator: Any = None

    def json_schema(self) -> dict[str, Any]:
        schema = dict(self.input_schema)
        schema.pop("title", None)
        return schema

    def validate_input(self, data: Any) -> dict[str, Any]:
        """The arguments as a dict once they satisfy the tool's ``inputSchema`` (else ToolInputError)."""
        args = parse_arguments(self.name, data)
        v = self.validator
        if v is not None and next(v.iter_errors(args), None) is not None:
            from jsonschema.exceptions import best_match

            err = best_match(v.iter_errors(args))
            where = "/".join(str(p) for p in err.absolute_path)
            at = f" at {where!r}" if where else ""
            raise ToolInputError(f"Invalid arguments for tool {self.name!r}{at}: {err.message}. The server "
                                 "was not called.")
        return args

    @property
    def wants_context(self) -> bool:  # (the call's idempotency key goes to the server)
        return True

    @property
    def reports_updates(self) -> bool:  # (progress, and the server's questions for a person)
        return True

    async def call(self, kwargs: dict[str, Any], context: Any = None,
                   returned: Any = None) -> Any:  # (``returned``: for sync tools; this one is async)
        assert self.server is not None
        return await self.server.call_tool(self.remote_name, kwargs, context=context)


# --------------------------------------------------------------------------- policy


@dataclass(frozen=True)
class PolicyOptions:
    trust_annotations: bool = False
    policies: Mapping[str, ToolPolicy] = field(default_factory=dict)
    #: True, False, or the server's own names of the tools that need a person's approval
    requires_approval: Union[bool, frozenset[str]] = False

    def approval(self, name: str) -> bool:
        rule = self.requires_approval
        return rule if isinstance(rule, bool) else name in rule


def tool_policy(name: str, hints: Mapping[str, Any], opts: PolicyOptions) -> tuple[ToolPolicy, str]:
    """The effective policy of the server's tool ``name`` and why (see the module docstring)."""
    approval = opts.approval(name)
    override = opts.policies.get(name)
    if override is not None:
        if approval and override.requires_approval is False:
            override = replace(override, requires_approval=True)
        return override, "policies="
    read_only = hints.get("read_only_hint") is True
    idempotent = hints.get("idempotent_hint") is True
    if read_only and opts.trust_annotations:
        return ToolPolicy(side_effects=False, requires_approval=approval), "readOnlyHint (trusted)"
    if idempotent and opts.trust_annotations:
        return ToolPolicy(idempotent=True, requires_approval=approval), "idempotentHint (trusted)"
    if read_only or idempotent:
        hint = "readOnlyHint" if read_only else "idempotentHint"
        return ToolPolicy(requires_approval=approval), f"default ({hint} not trusted)"
    return ToolPolicy(requires_approval=approval), "default"


#: a tool name as MCP names them (SEP-986: 1-128 of ASCII letters, digits, ``_``, ``-`` and ``.``)
_TOOL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")


def hidden_reason(tool: Any) -> Optional[str]:
    """Why a listed tool is not offered to the model (None: it is). A tool whose ``execution``
    says ``taskSupport: "required"`` answers a plain call with an error (MCP 2025-11-25: it
    must be called as a task, which this client does not do), so the model never sees it; nor
    one whose name is not a tool name (``<script>``, spaces, 200 characters): a provider would
    refuse every request that offers it, failing each step of the run."""
    name = getattr(tool, "name", None)
    if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
        return ("its name is not a tool name (MCP's: 1-128 ASCII letters, digits, '_', '-' and '.'), and a "
                "model provider would refuse every request offering it")
    execution = getattr(tool, "execution", None)
    if getattr(execution, "task_support", None) == "required":
        return ('it must be called as a task (execution.taskSupport "required"), and we0nb calls tools '
                "plainly; a plain call would always fail")
    return None


def make_tool(server: Endpoint, tool: Any, opts: PolicyOptions, prefix: str) -> MCPTool:
    """One listed MCP tool (an ``mcp.types.Tool``) as a definition the agent can call."""
    ann = tool.annotations
    hints = {h: getattr(ann, h, None) for h in HINTS} if ann is not None else {h: None for h in HINTS}
    policy, source = tool_policy(tool.name, hints, opts)
    schema = dict(tool.input_schema or {"type": "object"})
    return MCPTool(
        name=prefix + tool.name,
        function=functools.partial(server.call_tool, tool.name),
        input_model=_MCPArguments,
        description=tool.description or tool.title or "",
        policy=policy,
        is_async=True,
        server=server,
        remote_name=tool.name,
        input_schema=schema,
        annotations=hints,
        policy_source=source,
        validator=_validator(schema, server, tool.name),
    )


def _validator(schema: dict[str, Any], server: Endpoint, name: str) -> Any:
    """A compiled JSON Schema validator (None, with a warning, for a schema that is not valid)."""
    from jsonschema import validators
    from jsonschema.exceptions import SchemaError

    cls = validators.validator_for(schema)
    try:
        cls.check_schema(schema)
    except SchemaError as e:
        log.warning("%s: tool %r has an invalid inputSchema (%s); its arguments are sent unchecked",
                    server.label, name, e.message)
        return None
    return cls(schema)


# --------------------------------------------------------------------------- results


def to_return(result: Any, label: str, tool_name: str) -> Any:
    """A ``CallToolResult`` as a tool return value: ``structuredContent`` as JSON, otherwise the
    text joined with a line for each image, audio, file and link (so the model knows they are
    there); those become attachments, with their annotations. An embedded text resource keeps
    its ``uri`` and ``mimeType`` (a header line above its text). ``isError`` raises ToolError."""
    texts: list[str] = []
    attachments: list[Attachment] = []
    for block in result.content or ():
        line, attachment = _block(block)
        if line is not None:
            texts.append(line)
        if attachment is not None:
            attachments.append(attachment)
    if result.is_error:
        message = "\n".join(texts)
        raise ToolError(message or f"{label}: tool {tool_name!r} reported an error without a message.")
    structured = result.structured_content
    output: Any = structured if structured is not None else "\n".join(texts)
    return ToolReturn(output, tuple(attachments)) if attachments else output


def _block(block: Any) -> tuple[Optional[str], Optional[Attachment]]:
    """One content block: the line the model reads, and the attachment people see (either may be None)."""
    kind = getattr(block, "type", None)
    ann = _annotations(block)
    if kind == "text":
        return block.text, None
    if kind in ("image", "audio"):
        return (f"[{kind} {block.mime_type}, {len(block.data.rstrip('=')) * 3 // 4} bytes]",
                Attachment(type=kind, mime_type=block.mime_type, data=block.data, annotations=ann))
    if kind == "resource_link":
        return (f"[link {block.name}: {block.uri}]",
                Attachment(type="link", uri=str(block.uri), name=block.name, mime_type=block.mime_type,
                           annotations=ann))
    if kind == "resource":
        res = block.resource
        uri, mime = str(res.uri), getattr(res, "mime_type", None)
        head = f"[resource {uri}{', ' + mime if mime else ''}]"
        if getattr(res, "text", None) is not None:
            return f"{head}\n{res.text}", Attachment(type="file", uri=uri, mime_type=mime, annotations=ann)
        return (f"[file {uri}{', ' + mime if mime else ''}]",
                Attachment(type="file", uri=uri, mime_type=mime, data=getattr(res, "blob", None), annotations=ann))
    return None, None


def _annotations(block: Any) -> Optional[dict[str, Any]]:
    ann = getattr(block, "annotations", None)
    if ann is None:
        return None
    data = ann.model_dump(mode="json", by_alias=True, exclude_none=True)
    return data or None


def call_error(exc: BaseException, label: str, tool_name: str, timeout: Optional[float],
               closed_reason: Optional[str], again: str) -> ToolError:
    """What a failed call becomes: one clear line the model (and a person) can act on."""
    from mcp.shared.exceptions import MCPError
    from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

    call = f"the call to {tool_name!r}"
    if isinstance(exc, MCPError):
        if exc.error.code == REQUEST_TIMEOUT:
            return ToolError(f"{label} did not answer {call} within {timeout:g} s (timeout=), so it was "
                             "cancelled (notifications/cancelled sent); its outcome is unknown.",
                             {"mcp_error": "timeout"})
        if exc.error.code == CONNECTION_CLOSED:
            why = closed_reason or "the server process exited or the connection dropped"
            return ToolError(f"{label}: the connection ended during {call} ({why}); its outcome is unknown. "
                             f"{again}", {"mcp_error": "connection_closed"})
        return ToolError(f"{label} refused {call}: {exc.error.message} (JSON-RPC error {exc.error.code}).",
                         {"mcp_error": "protocol"})
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]["msg"] if exc.errors() else str(exc)
        return ToolError(f"{label} answered {call} with something that is not a valid MCP tool result "
                         f"({first}).", {"mcp_error": "invalid_result"})
    text = str(exc)
    return ToolError(f"{label}: {call} failed: {type(exc).__name__}{': ' + text if text else ''}.",
                     {"mcp_error": type(exc).__name__})
