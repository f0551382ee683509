"""MCP servers as tools: ``MCPServer.stdio(...)`` / ``MCPServer.http(...)`` in ``We0Agent(tools=[...])``.

Importing this package does not import the ``mcp`` SDK; building a server does (install it with
``pip install "we0nb[mcp]"``). See :mod:`we0nb.mcp.server`.
"""

from .client import Elicitation, Progress
from .server import MCPServer

__all__ = ["MCPServer", "Progress", "Elicitation"]
