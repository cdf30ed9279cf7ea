"""An MCP server of the official Python `mcp` SDK (2.x) for plugd's tests of
the stateless revision 2026-07-28: `MCPServer` as it comes, over stdio
(`stdio`, the default) or over Streamable HTTP without sessions (`http`:
`streamable_http_app(stateless_http=True)` on loopback; prints
`url: http://127.0.0.1:PORT/mcp` once it listens).

The tool `revision` reports what the SDK made of the request that called
it (its protocol revision, the client capabilities it carried, and on HTTP
the routing headers), so the test asserts on what went over the wire;
`refuse` answers with a JSON-RPC error of its own, `ask_name` with a
2026-07-28 `input_required` result (the gateway's pass-through tests).
"""

import socket
import sys

from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import InputRequiredResult

app = MCPServer("stateless", instructions="a 2026-07-28 test server")


@app.tool()
async def echo(text: str, ctx: Context) -> str:
    """Echoes text, reporting progress twice."""
    await ctx.report_progress(1, 2, "half")
    await ctx.report_progress(2, 2, "done")
    return text


@app.tool()
async def revision(ctx: Context) -> dict:
    """The revision and envelope of this very request, as the server saw them."""
    caps = ctx.client_capabilities
    headers = ctx.headers or {}
    return {
        "protocolVersion": ctx.protocol_version,
        "clientCapabilities": caps.model_dump(by_alias=True, exclude_none=True) if caps else None,
        "mcpProtocolVersionHeader": headers.get("mcp-protocol-version"),
        "mcpMethodHeader": headers.get("mcp-method"),
        "mcpNameHeader": headers.get("mcp-name"),
        "sessionHeader": headers.get("mcp-session-id"),
    }


@app.tool()
async def fail(ctx: Context) -> str:
    """Always fails."""
    raise ValueError("failed on purpose")


@app.tool()
async def refuse() -> str:
    """Answers with a JSON-RPC error of its own (code and data)."""
    raise MCPError(code=-32042, message="refused on purpose", data={"why": "a test", "retry": False})


@app.tool()
async def ask_name(ctx: Context) -> str | InputRequiredResult:
    """2026-07-28: asks the caller's name with input_required, then greets."""
    answer = (ctx.input_responses or {}).get("name")
    content = getattr(answer, "content", None) or {}
    if ctx.request_state != "asked" or "name" not in content:
        return InputRequiredResult.model_validate(
            {
                "inputRequests": {
                    "name": {
                        "method": "elicitation/create",
                        "params": {
                            "message": "Your name?",
                            "requestedSchema": {"type": "object", "properties": {"name": {"type": "string"}}},
                        },
                    }
                },
                "requestState": "asked",
            }
        )
    caps = ctx.client_capabilities
    asked_of = "an elicitation client" if caps is not None and caps.elicitation is not None else "someone"
    return f"Hello, {content['name']}! (asked of {asked_of})"


@app.resource("note://stateless", mime_type="text/plain")
def note() -> str:
    """A note."""
    return "read over 2026-07-28"


@app.prompt()
def greet(name: str) -> str:
    """Greets someone."""
    return f"Hello, {name}!"


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "stdio"
    if mode == "stdio":
        app.run()
        return
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)  # connections wait in the backlog until uvicorn runs
    port = sock.getsockname()[1]
    starlette = app.streamable_http_app(stateless_http=True)
    print(f"url: http://127.0.0.1:{port}/mcp", flush=True)
    config = uvicorn.Config(starlette, log_level="warning")
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
