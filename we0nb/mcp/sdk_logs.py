"""The MCP SDK's tracebacks for faults we0nb reports in one line, demoted to debug records.

The SDK logs a full traceback (``logger.exception``) when a server answers something that is
not MCP, when an OAuth flow fails, and when a transport closed by an abort is still being
written to; we0nb turns the same faults into one :class:`~we0nb.MCPServerError` or tool error
line (or, for the close, nothing to report). Those records are kept as DEBUG records: a handler
sees them (with their traceback) only where their logger is enabled for DEBUG — so a user's
notebook, or a program that configured logging at WARNING, gets the one line, not a traceback
too. Only these messages of the SDK's client loggers are touched, and only once a connection is
opened.
"""

from __future__ import annotations

import logging

__all__ = ["quiet_sdk_tracebacks"]

#: the SDK's client loggers and the messages (their start) whose fault we0nb reports itself
_REPORTED = {
    "mcp.client.streamable_http": ("Error parsing SSE message", "Error parsing JSON response", "Error in post_writer",
                                   "Unexpected content type"),
    "mcp.client.auth.oauth2": ("OAuth flow error",),
    "mcp.client.stdio": ("Failed to parse JSONRPC message from server",),
}


class _Demote(logging.Filter):
    """On the SDK's logger: these records become DEBUG ones, and go on only where it logs DEBUG
    (the logger let them through at their own level, before this filter ran)."""

    def __init__(self, logger: logging.Logger, messages: tuple[str, ...]) -> None:
        super().__init__()
        self.logger = logger
        self.messages = messages

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.DEBUG and isinstance(record.msg, str) and record.msg.startswith(self.messages):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return self.logger.isEnabledFor(logging.DEBUG)
        return True


_installed = False


def quiet_sdk_tracebacks() -> None:
    """Install the filters (once per process)."""
    global _installed
    if _installed:
        return
    _installed = True
    for name, messages in _REPORTED.items():
        logger = logging.getLogger(name)
        logger.addFilter(_Demote(logger, messages))
