"""A batch as one span: ``invoke_workflow {name}``, parent of its items' runs.

The span is made the current one (an OpenTelemetry context attached) in the task that runs
the batch, before any of its workers' tasks exist; those tasks inherit the context, so each
item's ``invoke_agent`` span is its child. Several processes sharing a batch each have a
span of their own (their runs are theirs); they share ``we0nb.batch.name``.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from opentelemetry import context, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from . import attributes as A

__all__ = ["BatchTracer"]

log = logging.getLogger("we0nb.telemetry")


class BatchTracer:
    """The span of one ``agent.batch()`` call (see :mod:`we0nb.batch.observe`)."""

    def __init__(self, tracer: Any, agent: Any, name: str, items: int, concurrency: int) -> None:
        model = agent.model
        attrs = {A.OPERATION: "invoke_workflow", A.AGENT_NAME: name, A.PROVIDER: model.provider_name,
                 A.REQUEST_MODEL: model.request_model, "we0nb.batch.name": name, "we0nb.batch.items": items,
                 "we0nb.batch.concurrency": concurrency}
        self.span = tracer.start_span(f"invoke_workflow {name}", kind=SpanKind.INTERNAL, attributes=attrs)
        self.token: Optional[object] = None
        #: whether an error's text may go on the span (it may quote content: see capture_content)
        self.content: bool = bool(getattr(agent, "capture_content", False))

    def started(self) -> None:
        """Make the batch's span the parent of what this task starts from now on."""
        self.token = context.attach(trace.set_span_in_context(self.span))

    def ended(self, result: Any, error: Optional[BaseException]) -> None:
        """The call ended: its counts, cost and why it stopped (or the error that ended it)."""
        try:
            if result is not None:
                attrs: dict[str, Any] = {f"we0nb.batch.{status}": n for status, n in result.counts.items()}
                if result.stopped is not None:
                    attrs["we0nb.batch.stopped"] = result.stopped
                cost = result.cost
                if cost is not None:
                    attrs[A.COST] = cost
                self.span.set_attributes(attrs)
            if error is not None:
                self.span.set_attribute(A.ERROR_TYPE, A.error_type(error))
                self.span.set_status(Status(StatusCode.ERROR, str(error)[:300] if self.content else None))
        finally:
            if self.token is not None:
                context.detach(self.token)  # type: ignore[arg-type]
                self.token = None
            self.span.end()
