"""Tools: a function plus its input schema and its execution policy.

The policy is what makes resume safe: ``side_effects=True`` (the default) means the tool
is never executed twice — an unfinished call is interrupted, not replayed — while a
read-only tool declares ``side_effects=False`` and is recalled. ``blocks_on_error=True``
means an error of this tool stops the later calls of the same step.

A tool with side effects can earn more than "at most once" (SPEC §11): every call carries a
stable idempotency key (:class:`ToolContext`, passed to a parameter annotated with it), and a
tool that deduplicates on it (``idempotent=True``) or can tell whether a call ran
(``reconcile=fn`` returning a :class:`Reconciled`) is completed on resume instead of
interrupted: exactly once.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Generic, Literal, Mapping, Optional, TypeVar, Union, get_type_hints, overload

import pydantic_core
from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from ._json import deep_message, too_deep
from ._text import clean

__all__ = ["ToolDefinition", "AnyToolDefinition", "ToolPolicy", "tool", "ToolInputError", "ToolOutputError",
           "ToolError", "ToolReturn", "ToolContext", "Reconciled", "ReconcileFunction", "to_output",
           "parse_arguments"]

R = TypeVar("R")


ApprovalRule = Union[bool, Callable[[dict[str, Any]], bool]]


@dataclass(frozen=True)
class ToolContext:
    """What an execution of a call knows about itself, passed to a tool parameter annotated
    ``ToolContext`` (any name, any position; never part of the schema the model sees).

    ``idempotency_key`` is the same for every execution of one call — across aborts, resumes,
    processes and hosts — and different for any two calls (also across sessions and forks):
    printable ASCII, at most 255 characters; send it to a service that deduplicates on it
    (an ``Idempotency-Key`` header). ``attempt`` is 1 for the call's first execution and one
    more for each later one, counted from the store.
    """

    session_id: str
    call_id: str
    tool: str
    idempotency_key: str
    attempt: int = 1
    #: for a tool that ``reports_updates`` (MCP tools): the run's
    #: :class:`~we0nb.engine.questions.CallUpdates` — ``progress(data)``, ``await ask(question)``
    updates: Any = field(default=None, compare=False, repr=False)


class Reconciled:
    """A reconcile's answer about a call that may have run: ``Reconciled.done(output)`` (it ran;
    ``output`` is its result, as if the tool had returned it), ``Reconciled.not_done()``, or
    ``Reconciled.unknown(reason)``."""

    __slots__ = ("kind", "output", "reason")

    def __init__(self, kind: str, output: Any = None, reason: str = "") -> None:
        if kind not in ("done", "not_done", "unknown"):
            raise ValueError(f"Reconciled: kind must be 'done', 'not_done' or 'unknown', got {kind!r}.")
        self.kind: Literal["done", "not_done", "unknown"] = kind  # type: ignore[assignment]
        self.output = output
        self.reason = str(reason)

    @classmethod
    def done(cls, output: Any = None) -> "Reconciled":
        return cls("done", output)

    @classmethod
    def not_done(cls) -> "Reconciled":
        return cls("not_done")

    @classmethod
    def unknown(cls, reason: str = "") -> "Reconciled":
        return cls("unknown", reason=reason or "the reconcile could not tell")

    def __repr__(self) -> str:
        if self.kind == "done":
            return f"Reconciled.done({self.output!r})"
        return "Reconciled.not_done()" if self.kind == "not_done" else f"Reconciled.unknown({self.reason!r})"

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Reconciled) and (self.kind, self.output, self.reason)
                == (other.kind, other.output, other.reason))

    __hash__ = None  # type: ignore[assignment]


#: ``fn(ctx, input)`` (sync or async) → :class:`Reconciled`: did the call of ``ctx`` run?
ReconcileFunction = Callable[[ToolContext, dict[str, Any]], Any]


@dataclass(frozen=True)
class ToolPolicy:
    """How the engine may treat a call of a tool.

    ``side_effects``: an unfinished call is interrupted on resume, never replayed (read-only
    tools say False and are recalled). ``blocks_on_error``: an error stops the later calls of
    the step. ``requires_approval``: True, or a function of the call's input (the arguments
    as a dict) returning True when a person must approve the call before it runs.
    ``idempotent``: executing a call again with the same idempotency key has no further
    effect, so resume executes an unfinished call again instead of interrupting it.
    ``reconcile``: ``fn(ctx, input)`` asked on resume whether a call found ``running`` ran
    (see :class:`Reconciled`); ``reconcile_timeout`` bounds how long it may take (seconds).
    """

    side_effects: bool = True
    blocks_on_error: bool = False
    requires_approval: ApprovalRule = False
    idempotent: bool = False
    reconcile: Optional[ReconcileFunction] = None
    reconcile_timeout: float = 30.0

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
    :class:`~we0nb.messages.Attachment` objects stored in the call's completed state;
    ``metadata`` (JSON values) is added to that state's metadata (an MCP call's last progress).
    """

    output: Any
    attachments: tuple[Any, ...] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)


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


def _in_words(e: ValidationError) -> str:
    """What pydantic found wrong, as a sentence a person (and a model) reads: where, what, the value
    given — without pydantic's ``[type=…, input_value=…]`` codes."""

    def one(err: Any) -> str:
        loc = ".".join(str(x) for x in err["loc"])
        value = err.get("input")
        got = "" if err["type"] == "missing" or isinstance(value, dict) else f" (got {repr(value)[:60]})"
        return f"{loc!r}: {err['msg']}{got}" if loc else f"{err['msg']}{got}"

    errors = e.errors(include_url=False)
    if len(errors) == 1:
        text = one(errors[0])
        return f" at {text}." if errors[0]["loc"] else f": {text}."
    return ": " + "; ".join(one(err) for err in errors) + "."


@dataclass(frozen=True)
class ToolDefinition(Generic[R]):
    """A callable tool: name, description, input model, policy, and the function."""

    name: str
    function: Callable[..., Union[R, Awaitable[R]]]
    input_model: type[BaseModel]
    description: str = ""
    policy: ToolPolicy = field(default_factory=ToolPolicy)
    is_async: bool = False
    #: the parameter that receives the :class:`ToolContext` (None: the function takes none)
    context_param: Optional[str] = None

    @property
    def side_effects(self) -> bool:
        return self.policy.side_effects

    @property
    def wants_context(self) -> bool:
        """Whether :meth:`call` reads the :class:`ToolContext` (else the executor makes none)."""
        return self.context_param is not None

    @property
    def reports_updates(self) -> bool:
        """Whether :meth:`call` reports progress or asks a person while it runs (through
        ``context.updates``): the executor then runs it in a task of its own and shows each update."""
        return False

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
            raise ToolInputError(f"Invalid arguments for tool {self.name!r}{_in_words(e)}") from None
        return {name: getattr(model, name) for name in type(model).model_fields}

    async def call(self, kwargs: dict[str, Any], context: Optional[ToolContext] = None,
                   returned: Optional[Callable[[], None]] = None) -> Any:
        """Run the function with validated ``kwargs`` (a sync one on a worker thread) and, when
        it takes one, ``context``; its return value. ``returned``: called on the worker thread
        when a sync function returns or raises — also after the wait for it was cancelled."""
        if self.context_param is not None:
            kwargs = {**kwargs, self.context_param: context}
        if self.is_async:
            return await self.function(**kwargs)  # type: ignore[misc]
        if returned is None:
            return await asyncio.to_thread(self.function, **kwargs)
        return await asyncio.to_thread(_then, self.function, kwargs, returned)

    async def execute(self, data: Any) -> str:
        """Validate ``data``, run the function and convert the result (the engine splits these
        steps to write the call ``running`` in between)."""
        return to_output(await self.call(self.validate_input(data)))


AnyToolDefinition = ToolDefinition[Any]


def _then(fn: Callable[..., Any], kwargs: dict[str, Any], returned: Callable[[], None]) -> Any:
    try:
        return fn(**kwargs)
    finally:
        returned()


def parse_arguments(tool_name: str, data: Any) -> dict[str, Any]:
    """The model's arguments as a dict (a JSON string is parsed), or :class:`ToolInputError`."""
    if isinstance(data, str):
        try:
            data = json.loads(data) if data.strip() else {}
        except json.JSONDecodeError as e:
            raise ToolInputError(f"Arguments for tool {tool_name!r} are not valid JSON: {e}") from None
        except RecursionError:
            raise ToolInputError(deep_message(tool_name)) from None
    if not isinstance(data, dict):
        raise ToolInputError(f"Arguments for tool {tool_name!r} must be a JSON object, got {type(data).__name__}.")
    if too_deep(data):
        raise ToolInputError(deep_message(tool_name))
    return data


def _is_context(ann: Any) -> bool:
    """Whether an annotation names :class:`ToolContext` (also written as a string, as under
    ``from __future__ import annotations`` when it cannot be resolved)."""
    if ann is ToolContext:
        return True
    if isinstance(ann, str):
        return ann.strip().strip("'\"").rsplit(".", 1)[-1] == "ToolContext"
    return False


def _input_model(fn: Callable[..., Any], name: str) -> tuple[type[BaseModel], Optional[str]]:
    """The model of the arguments the model gives, and the parameter taking the context."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as e:  # (a builtin without a signature)
        raise TypeError(f"Tool {name!r}: its parameters cannot be read ({e}); wrap it in a def "
                        f"with named, annotated parameters.") from None
    try:
        hints = get_type_hints(fn)
    except Exception:  # unresolved forward references: fall back to the raw annotations
        hints = {}
    fields: dict[str, Any] = {}
    context: Optional[str] = None
    for pname, param in sig.parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"Tool {name!r}: *args/**kwargs are not supported; name every parameter.")
        if param.kind is param.POSITIONAL_ONLY:
            raise TypeError(f"Tool {name!r}: parameter {pname!r} is positional-only, but a tool is called "
                            f"with keyword arguments; remove the '/' (or wrap the function in a def).")
        ann = hints.get(pname, param.annotation)
        if _is_context(ann) or _is_context(param.annotation):
            if context is not None:
                raise TypeError(f"Tool {name!r}: two parameters are annotated ToolContext ({context!r} and "
                                f"{pname!r}); declare at most one.")
            context = pname
            continue
        if ann is inspect.Parameter.empty:
            ann = Any
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[pname] = (ann, default)
    model_name = "".join(part.capitalize() for part in name.split("_")) + "Input"
    model = create_model(model_name, __config__=ConfigDict(extra="forbid"), **fields)  # type: ignore[call-overload]
    return model, context


def _description(fn: Callable[..., Any]) -> str:
    return inspect.cleandoc(fn.__doc__ or "").strip()


@overload
def tool(fn: Callable[..., Any], /, *, name: Optional[str] = None, description: Optional[str] = None,
         side_effects: bool = True, blocks_on_error: bool = False, requires_approval: ApprovalRule = False,
         idempotent: bool = False, reconcile: Optional[ReconcileFunction] = None) -> AnyToolDefinition: ...


@overload
def tool(fn: None = None, /, *, name: Optional[str] = None, description: Optional[str] = None,
         side_effects: bool = True, blocks_on_error: bool = False, requires_approval: ApprovalRule = False,
         idempotent: bool = False, reconcile: Optional[ReconcileFunction] = None
         ) -> Callable[[Callable[..., Any]], AnyToolDefinition]: ...


def tool(fn: Optional[Callable[..., Any]] = None, /, *, name: Optional[str] = None,
         description: Optional[str] = None, side_effects: bool = True, blocks_on_error: bool = False,
         requires_approval: ApprovalRule = False, idempotent: bool = False,
         reconcile: Optional[ReconcileFunction] = None) -> Any:
    """Turn a sync or async function into a tool definition.

    ``@tool``, ``@tool(side_effects=False)`` and ``tool(fn, ...)`` all work. The input
    schema comes from the type hints; the docstring is the description.
    ``requires_approval``: True, or a function of the call's input dict returning True, when
    a person must approve a call before it runs (see ``We0Agent.approve``).
    ``idempotent`` / ``reconcile``: how resume may complete a call that may have run (see
    :class:`ToolPolicy`, :class:`ToolContext`, :class:`Reconciled`).
    """
    check_policy(side_effects=side_effects, blocks_on_error=blocks_on_error,
                 requires_approval=requires_approval, idempotent=idempotent, reconcile=reconcile)
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise TypeError(f"tool(): name must be a non-empty string, got {name!r}.")
    if description is not None and not isinstance(description, str):
        raise TypeError(f"tool(): description must be a string, got {type(description).__name__}.")

    def build(f: Callable[..., Any]) -> AnyToolDefinition:
        if isinstance(f, ToolDefinition):
            raise TypeError(f"{f.name!r} is already a tool definition.")
        if not callable(f):
            raise TypeError(f"tool() expects a function, got {type(f).__name__}.")
        tool_name = name or getattr(f, "__name__", None)
        if not tool_name or tool_name == "<lambda>":
            what = ("a lambda" if tool_name == "<lambda>" else "a functools.partial"
                    if isinstance(f, functools.partial) else f"an object of class {type(f).__name__}")
            raise TypeError(f"tool(): {what} has no name of its own; pass name='...'.")
        target = f.func if isinstance(f, functools.partial) else f
        if not inspect.isroutine(target) and not inspect.isclass(target):  # (an object with __call__)
            target = type(target).__call__
        input_model, context = _input_model(f, tool_name)
        return ToolDefinition(
            name=tool_name,
            function=f,
            input_model=input_model,
            description=description if description is not None else _description(target),
            policy=ToolPolicy(side_effects=side_effects, blocks_on_error=blocks_on_error,
                              requires_approval=requires_approval, idempotent=idempotent, reconcile=reconcile),
            is_async=inspect.iscoroutinefunction(target),
            context_param=context,
        )

    if fn is None:
        return build
    return build(fn)


def check_policy(*, side_effects: Any = True, blocks_on_error: Any = False, requires_approval: Any = False,
                 idempotent: Any = False, reconcile: Any = None) -> None:
    """A clear ``TypeError`` at definition time for a policy keyword of the wrong kind."""
    for key, value in (("side_effects", side_effects), ("blocks_on_error", blocks_on_error),
                       ("idempotent", idempotent)):
        if not isinstance(value, bool):
            raise TypeError(f"tool(): {key} must be True or False, got {value!r}.")
    if not isinstance(requires_approval, bool) and not callable(requires_approval):
        raise TypeError("tool(): requires_approval must be True, False, or a function of the call's input "
                        "(a dict) returning True when a person must approve the call.")
    if reconcile is not None and not callable(reconcile):
        raise TypeError(f"tool(): reconcile must be a function fn(ctx, input) returning Reconciled.done(output), "
                        f".not_done() or .unknown(reason); got {type(reconcile).__name__}.")
