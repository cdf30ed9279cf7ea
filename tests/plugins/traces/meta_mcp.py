"""An MCP server of the official Python `mcp` SDK (2.x) over stdio for
plugd's trace tests: the tool `meta` answers with the `_meta` of the very
`tools/call` request that called it (as the SDK parsed it), so the test sees
the `traceparent` plugd sent.
"""

from mcp.server.mcpserver import Context, MCPServer

app = MCPServer("traced")


@app.tool()
async def meta(ctx: Context) -> dict:
    """The _meta of this request."""
    return dict(ctx.request_context.meta or {})


if __name__ == "__main__":
    app.run()
