"""An MCP server that asks things of its host, for plugd's tests of what a
hosted server may request and of calls failed by a runaway kill.

Written with the official Python SDK (mcp==2.3.0, its high-level
`MCPServer`), on stdio: plugd starts it from `.mcp.json`.

Tools:
* `stubborn(seconds)`: ignores cancellation (its work is shielded) and keeps
  sending progress for its request, so plugd kills the server.
* `slow_read(ms)`: read-only (`readOnlyHint`), sleeps, returns the pid.
* `slow_write(ms)`: neither read-only nor idempotent, sleeps, returns the pid.
* `pid()`: the process id (read-only).
* `ask(message)`: elicits a form (name: string, age: integer >= 0).
* `sample(prompt, max_tokens, image)`: `sampling/createMessage` through
  `ctx.session.create_message`; an image message when `image` is true.
"""

import asyncio
import os
import warnings

import anyio
import mcp_types as types
from mcp.server.mcpserver import Context, MCPServer

warnings.simplefilter("ignore")

server = MCPServer(name="plugd-requests", version="1.0.0")

READ_ONLY = types.ToolAnnotations(read_only_hint=True)
WRITE = types.ToolAnnotations(read_only_hint=False, idempotent_hint=False, destructive_hint=False)


@server.tool(description="Works on after a cancel, sending progress.", annotations=WRITE)
async def stubborn(seconds: float, ctx: Context) -> dict[str, object]:
    # The SDK cancels the request's task on notifications/cancelled; the
    # shield keeps the work (and its progress) going regardless.
    with anyio.CancelScope(shield=True):
        steps = int(seconds * 10)
        for i in range(steps):
            await ctx.report_progress(i, steps, "still working")
            await anyio.sleep(0.1)
    return {"done": True}


@server.tool(description="Reads slowly.", annotations=READ_ONLY)
async def slow_read(ms: int) -> dict[str, object]:
    await asyncio.sleep(ms / 1000)
    return {"pid": os.getpid()}


@server.tool(description="Writes slowly; not safe to repeat.", annotations=WRITE)
async def slow_write(ms: int) -> dict[str, object]:
    await asyncio.sleep(ms / 1000)
    return {"pid": os.getpid()}


@server.tool(description="The process id.", annotations=READ_ONLY)
def pid() -> dict[str, object]:
    return {"pid": os.getpid()}


@server.tool(description="Asks the user for a name and an age.", annotations=READ_ONLY)
async def ask(message: str, ctx: Context) -> dict[str, object]:
    result = await ctx.session.elicit_form(
        message=message,
        requested_schema={
            "type": "object",
            "properties": {
                "name": {"type": "string", "description": "Your name"},
                "age": {"type": "integer", "minimum": 0},
            },
            "required": ["name"],
        },
        related_request_id=ctx.request_id,
    )
    out: dict[str, object] = {"action": result.action}
    if result.content is not None:
        out["content"] = result.content
    return out


@server.tool(description="Asks the host's LLM.", annotations=READ_ONLY)
async def sample(prompt: str, ctx: Context, max_tokens: int = 100, image: bool = False) -> dict[str, object]:
    content = (
        types.ImageContent(type="image", data="iVBORw0KGgo=", mime_type="image/png")
        if image
        else types.TextContent(type="text", text=prompt)
    )
    try:
        result = await ctx.session.create_message(
            messages=[types.SamplingMessage(role="user", content=content)],
            max_tokens=max_tokens,
            system_prompt="be brief",
            related_request_id=ctx.request_id,
        )
    except Exception as e:  # the host's refusal, as the server sees it
        return {"error": str(e)}
    out = result.content
    return {
        "role": result.role,
        "text": out.text if isinstance(out, types.TextContent) else repr(out),
        "model": result.model,
        "stopReason": result.stop_reason,
    }


if __name__ == "__main__":
    server.run("stdio")
