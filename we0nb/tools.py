"""Tools: a function plus its input schema and its execution policy.

The policy is what makes resume safe: ``side_effects=True`` (the default) means the tool
is never executed twice — an unfinished call is interrupted, not replayed — while a
read-only tool declares ``side_effects=False`` and is recalled. ``blocks_on_error=True``
means an error of this tool stops the later calls of the same step.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Generic, Optional, TypeVar, Union, get_type_hints, overload

import pydantic_core
from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from ._text import clean

__all__ = ["ToolDefinition", "AnyToolDefinition", "ToolPolicy", "tool", "ToolInputError", "ToolOutputError",
           "ToolError", "ToolReturn", "to_output", "parse_arguments"]

R = TypeVar("R")


ApprovalRule = Union[bool, Callable[[dict[str, Any]], bool]]


@dataclass(frozen=True)
class ToolPolicy:
    """How the engine may treat a call of a tool.

    ``side_effects``: an unfinished call is interrupted on resume, never replayed (read-only
    tools say False and are recalled). ``blocks_on_error``: an error stops the later calls of
    the step. ``requires_approval``: True, or a function of the call's input (the arguments
    as a dict) returning True when a person must approve the call before it runs.
    """

    side_effects: bool = True
    blocks_on_error: bool = False
    requires_approval: ApprovalRule = False

    def approval_reason(self, tool_name: str, input: dict[str, Any]) -> Optional[str]:
        """Why a call with ``input`` needs a person's approval, or None when it does not."""
        rule = self.requires_approval
        if rule is True:
            return f"{tool_name} requires approval for every call"
        if rule is False or rule is None:
            return None
        try:
            needed = rule(dict(input))
        except Exception as e:  # a rule that fails asks rather than lets the call through
            return f"{tool_name}'s requires_approval rule failed ({type(e).__name__}: {e}), so a person decides"
        return f"{tool_name}'s requires_approval rule matched these arguments" if needed else None


class ToolInputError(ValueError):
    """The model's arguments do not match the tool's input schema."""


class ToolOutputError(ValueError):
    """A tool ran, but its return value cannot be turned into text (it is not JSON-serialisable)."""


class ToolError(Exception):
    """Raised by a tool to fail with exactly this text (no exception type in front of it).

    ``metadata`` joins the error state's metadata. MCP tools raise it with the server's text.
    """

    def __init__(self, message: str, metadata: Optional[dict[str, Any]] = None) -> None:
        super().__init__(message)
        self.metadata = dict(metadata or {})


@dataclass(frozen=True)
class ToolReturn:
    """A tool's return value with attachments (images, audio, links) kept beside its output.

    ``output`` becomes the text the model sees (as any return value); ``attachments`` are
    :class:`~we0nb.messages.Attachment` objects stored in the call's completed state.
    """

    output: Any
    attachments: tuple[Any, ...] = ()


def to_output(value: Any) -> str:
    """A tool's return value as the text the model sees: a string as is, anything else as JSON.

    The JSON is strict (NaN and infinities become the strings ``"NaN"``/``"Infinity"``), so a
    provider can always parse it. A value that cannot be serialised raises
    :class:`ToolOutputError`.
    """
    if isinstance(value, str):
        return clean(value)
    try:
        if isinstance(value, BaseModel):
            return clean(value.model_dump_json())
        return clean(pydantic_core.to_json(value, inf_nan_mode="strings").decode())
    except (pydantic_core.PydanticSerializationError, TypeError, ValueError, UnicodeError) as e:
        raise ToolOutputError(f"{type(value).__name__} is not JSON-serialisable ({e})") from e


@dataclass(frozen=True)
class ToolDefinition(Generic[R]):
    """A callable tool: name, description, input model, policy, and the function."""

    name: str
    function: Callable[..., Union[R, Awaitable[R]]]
    input_model: type[BaseModel]
    description: str = ""
    policy: ToolPolicy = field(default_factory=ToolPolicy)
    is_async: bool = False

    @property
    def side_effects(self) -> bool:
        return self.policy.side_effects

    @property
    def blocks_on_error(self) -> bool:
        return self.policy.blocks_on_error

    def json_schema(self) -> dict[str, Any]:
        """The input schema as JSON Schema (what a provider's tool list needs)."""
        schema = self.input_model.model_json_schema()
        schema.pop("title", None)
        return schema

    def validate_input(self, data: Any) -> dict[str, Any]:
        """Validated keyword arguments, or :class:`ToolInputError` saying what was wrong."""
        data = parse_arguments(self.name, data)
        try:
            model = self.input_model.model_validate(data)
        except ValidationError as e:
            raise ToolInputError(f"Invalid arguments for tool {self.name!r}: {e}") from None
        return {name: getattr(model, name) for name in type(model).model_fields}

    async def call(self, kwargs: dict[str, Any]) -> Any:
        """Run the function with validated ``kwargs`` (a sync one on a worker thread); its return value."""
        if self.is_async:
            return await self.function(**kwargs)  # type: ignore[misc]
        return await asyncio.to_thread(self.function, **kwargs)

    async def execute(self, data: Any) -> str:
        """Validate ``data``, run the function and convert the result (the engine splits these
        steps to write the call ``running`` in between)."""
        return to_output(await self.call(self.validate_input(data)))


AnyToolDefinition = ToolDefinition[Any]


def parse_arguments(tool_name: str, data: Any) -> dict[str, Any]:
    """The model's arguments as a dict (a JSON string is parsed), or :class:`ToolInputError`."""
    if isinstance(data, str):
        try:
            data = json.loads(data) if data.strip() else {}
        except json.JSONDecodeError as e:
            raise ToolInputError(f"Arguments for tool {tool_name!r} are not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ToolInputError(f"Arguments for tool {tool_name!r} must be a JSON object, got {type(data).__name__}.")
    return data


def _input_model(fn: Callable[..., Any], name: str) -> type[BaseModel]:
    sig = inspect.signature(fn)
    try:
        hints = get_type_hints(fn)
    except Exception:  # unresolved forward references: fall back to the raw annotations
        hints = {}
    fields: dict[str, Any] = {}
    for pname, param in sig.parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"Tool {name!r}: *args/**kwargs are not supported; name every parameter.")
        ann = hints.get(pname, param.annotation)
        if ann is inspect.Parameter.empty:
            ann = Any
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[pname] = (ann, default)
    model_name = "".join(part.capitalize() for part in name.split("_")) + "Input"
    return create_model(model_name, __config__=ConfigDict(extra="forbid"), **fields)  # type: ignore[call-overload]


def _description(fn: Callable[..., Any]) -> str:
    return inspect.cleandoc(fn.__doc__ or "").strip()


@overload
def tool(fn: Callable[..., Any], /, *, name: Optional[str] = None, description: Optional[str] = None,
         side_effects: bool = True, blocks_on_error: bool = False,
         requires_approval: ApprovalRule = False) -> AnyToolDefinition: ...


@overload
def tool(fn: None = None, /, *, name: Optional[str] = None, description: Optional[str] = None,
         side_effects: bool = True, blocks_on_error: bool = False, requires_approval: ApprovalRule = False
         ) -> Callable[[Callable[..., Any]], AnyToolDefinition]: ...


def tool(fn=None, /, *, name=None, description=None, side_effects=True, blocks_on_error=False,
         requires_approval=False):
    """Turn a sync or async function into a tool definition.

    ``@tool``, ``@tool(side_effects=False)`` and ``tool(fn, ...)`` all work. The input
    schema comes from the type hints; the docstring is the description.
    ``requires_approval``: True, or a function of the call's input dict returning True, when
    a person must approve a call before it runs (see ``We0Agent.approve``).
    """
    if not isinstance(side_effects, bool) or not isinstance(blocks_on_error, bool):
        raise TypeError("tool(): side_effects and blocks_on_error must be True or False.")
    if not isinstance(requires_approval, bool) and not callable(requires_approval):
        raise TypeError("tool(): requires_approval must be True, False, or a function of the call's input "
                        "(a dict) returning True when a person must approve the call.")

    def build(f: Callable[..., Any]) -> AnyToolDefinition:
        if isinstance(f, ToolDefinition):
            raise TypeError(f"{f.name!r} is already a tool definition.")
        if not callable(f):
            raise TypeError(f"tool() expects a function, got {type(f).__name__}.")
        tool_name = name or getattr(f, "__name__", None)
        if not tool_name or tool_name == "<lambda>":
            raise TypeError("tool(): a lambda has no name; pass name='...'.")
        target = f.func if isinstance(f, functools.partial) else f
        return ToolDefinition(
            name=tool_name,
            function=f,
            input_model=_input_model(f, tool_name),
            description=description if description is not None else _description(target),
            policy=ToolPolicy(side_effects=side_effects, blocks_on_error=blocks_on_error,
                              requires_approval=requires_approval),
            is_async=inspect.iscoroutinefunction(target),
        )

    if fn is None:
        return build
    return build(fn)
