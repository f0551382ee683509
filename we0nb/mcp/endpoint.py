"""What the connection, the tool adapter and the HTML read of a server (``MCPServer`` is one).

They depend on this protocol, not on :mod:`we0nb.mcp.server`, so the server module stands
above its parts and nothing imports it back.
"""

from __future__ import annotations

from typing import Any, AsyncContextManager, Protocol

__all__ = ["Endpoint"]


class Endpoint(Protocol):
    kind: str                  # "stdio" or "http"
    connect_timeout: float
    protocol: str              # "legacy" (the initialize handshake) or "auto" (2026-07-28 when served)
    options: Any               # PolicyOptions: trust_annotations, policies, requires_approval …
    features: Any              # ClientFeatures: the session's callbacks (elicitation, roots, logs)
    hidden_tools: dict[str, str]

    @property
    def label(self) -> str: ...   # how messages name the server

    @property
    def hint(self) -> str: ...    # what to check when it cannot be started

    @property
    def connected(self) -> bool: ...

    def transport(self, watch: Any) -> AsyncContextManager[Any]: ...  # watch: an HttpWatch

    async def call_tool(self, name: str, arguments: dict[str, Any], *, context: Any = None) -> Any: ...

    async def read_resource(self, uri: str) -> Any: ...

    def policy_table(self) -> list[dict[str, Any]]: ...
