"""The attribute names the spans carry, and the small conversions they need.

Names follow the OpenTelemetry GenAI semantic conventions as released in
``open-telemetry/semantic-conventions-genai`` **v0.1.0** (:data:`SEMCONV`); the ``we0nb.*``
ones are ours, for what the conventions have no name for (the run's mode and result,
recovery, approval, batches). ``gen_ai.usage.cost`` is not in the conventions (they define
no cost): it is the name tools that compute costs (OpenLIT among them) use.
"""

from __future__ import annotations

import json
from typing import Any, Optional

__all__ = ["SEMCONV", "SCOPE", "OPERATION", "AGENT_NAME", "CONVERSATION", "PROVIDER", "REQUEST_MODEL",
           "FINISH_REASONS", "INPUT_TOKENS", "OUTPUT_TOKENS", "CACHE_READ", "CACHE_CREATION", "COST",
           "SERVER_ADDRESS", "SERVER_PORT", "ERROR_TYPE", "TOOL_NAME", "TOOL_CALL_ID", "TOOL_TYPE",
           "TOOL_ARGUMENTS", "TOOL_RESULT", "INPUT_MESSAGES", "OUTPUT_MESSAGES", "SYSTEM_INSTRUCTIONS",
           "RUN_MODE", "RUN_RESULT", "RUN_ID", "STEP", "error_type", "finish_reason", "as_json", "usage_attributes"]

#: the conventions followed, and the instrumentation scope the spans are made under
SEMCONV = "semantic-conventions-genai v0.1.0"
SCOPE = "we0nb"

OPERATION = "gen_ai.operation.name"
AGENT_NAME = "gen_ai.agent.name"
CONVERSATION = "gen_ai.conversation.id"
PROVIDER = "gen_ai.provider.name"
REQUEST_MODEL = "gen_ai.request.model"
FINISH_REASONS = "gen_ai.response.finish_reasons"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
CACHE_READ = "gen_ai.usage.cache_read.input_tokens"
CACHE_CREATION = "gen_ai.usage.cache_creation.input_tokens"
COST = "gen_ai.usage.cost"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
ERROR_TYPE = "error.type"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
TOOL_TYPE = "gen_ai.tool.type"
TOOL_ARGUMENTS = "gen_ai.tool.call.arguments"
TOOL_RESULT = "gen_ai.tool.call.result"
INPUT_MESSAGES = "gen_ai.input.messages"
OUTPUT_MESSAGES = "gen_ai.output.messages"
SYSTEM_INSTRUCTIONS = "gen_ai.system_instructions"

RUN_MODE = "we0nb.run.mode"
RUN_RESULT = "we0nb.run.result"
RUN_ID = "we0nb.run.id"
STEP = "we0nb.step"


#: we0nb's finish reasons in the conventions' words (others pass with ``-`` → ``_``)
_FINISH = {"tool-calls": "tool_call", "content-filter": "content_filter"}


def finish_reason(reason: Optional[str]) -> str:
    """A finish reason as the conventions spell it (``tool_call``, ``content_filter``, ``stop`` …)."""
    if not reason:
        return "stop"
    return _FINISH.get(reason) or reason.replace("-", "_")


def error_type(error: BaseException) -> str:
    """``error.type`` of an exception: its class name (low cardinality, as the conventions ask)."""
    return type(error).__qualname__


def as_json(value: Any) -> str:
    """Content as a span attribute: compact JSON text (structured values are not allowed there)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def usage_attributes(usage: Any, cost: Optional[float]) -> dict[str, Any]:
    """A call's tokens (cache reads and writes when there are any) and cost (when known)."""
    attrs: dict[str, Any] = {INPUT_TOKENS: usage.input_tokens, OUTPUT_TOKENS: usage.output_tokens}
    if usage.cached_tokens:
        attrs[CACHE_READ] = usage.cached_tokens
    if usage.cache_write_tokens:
        attrs[CACHE_CREATION] = usage.cache_write_tokens
    if cost is not None:
        attrs[COST] = cost
    return attrs
