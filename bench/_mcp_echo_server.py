"""W8's server: one trivial ``echo`` tool, written with the official SDK's high-level server (stdio)."""

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

app = MCPServer("w8-echo")


@app.tool(annotations=ToolAnnotations(read_only_hint=True))
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


if __name__ == "__main__":
    app.run()
