"""A real MCP client, the official Python SDK (mcp==2.3.0), driving plugd's
MCP gateway for the integration tests (crates/plugd/tests/it/gateway.rs).

Usage: mcp_client.py PLAN_JSON. The plan names the transport and a list of
steps; the script runs them in order and prints one JSON report on stdout:

  {"transport": "stdio", "command": "plugd", "args": [...], "cwd": "...",
   "mode": "legacy" | "auto",                 # auto probes server/discover
   "elicit": "accept" | "decline" | null,     # null: no elicitation capability
   "sample": TEXT | null,                     # the sampling answer; null: no sampling capability
   "steps": [{"op": "list"},
             {"op": "call", "name": N, "args": {...}, "progress": true, "timeout": 5},
             {"op": "resources"}, {"op": "templates"}, {"op": "read", "uri": U},
             {"op": "prompts"}, {"op": "get_prompt", "name": N, "args": {...}},
             {"op": "complete_prompt", "name": N, "argument": {...}},
             {"op": "touch", "path": P},       # tells the test to act
             {"op": "wait_changed", "timeout": 10}]}
  {"transport": "http", "url": U, "token": T, ...}
  {"transport": "sse", "url": U, "token": T, ...}   # the 2024-11-05 HTTP+SSE transport
"""

import json
import pathlib
import sys

import anyio
import httpx2
import mcp_types as types
from mcp import Client, StdioServerParameters
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client


async def main() -> None:
    plan = json.loads(sys.argv[1])
    report = {"steps": [], "elicitations": [], "list_changed": 0}
    changed = anyio.Event()

    async def on_message(message) -> None:
        if isinstance(message, types.ServerNotification) and getattr(message, "method", "") == "notifications/tools/list_changed":
            report["list_changed"] += 1
            changed.set()

    async def on_elicit(context, params):
        report["elicitations"].append(params.message)
        if plan.get("elicit") == "accept":
            return types.ElicitResult(action="accept", content={"approve": True, "username": "ada", "email": "ada@example.org"})
        return types.ElicitResult(action="decline")

    async def on_sample(context, params):
        report.setdefault("samplings", []).append(params.messages[0].content.text)
        return types.CreateMessageResult(role="assistant", content=types.TextContent(type="text", text=plan["sample"]), model="test-model")

    async def on_log(params):
        report.setdefault("logs", []).append(params.data)

    if plan["transport"] == "stdio":
        server = StdioServerParameters(command=plan["command"], args=plan["args"], cwd=plan.get("cwd"), env=plan.get("env"))
    elif plan["transport"] == "sse":
        server = sse_client(plan["url"], headers={"Authorization": f"Bearer {plan['token']}"})
    else:
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {plan['token']}"}, timeout=30)
        server = streamable_http_client(plan["url"], http_client=http)

    kwargs = {"mode": plan.get("mode", "legacy"), "message_handler": on_message, "logging_callback": on_log}
    if plan.get("elicit"):
        kwargs["elicitation_callback"] = on_elicit
    if plan.get("sample"):
        kwargs["sampling_callback"] = on_sample
    async with Client(server, **kwargs) as client:
        report["protocol_version"] = client.protocol_version
        report["server_info"] = client.server_info.model_dump(mode="json") if client.server_info else None
        for step in plan["steps"]:
            op = step["op"]
            if op == "list":
                result = await client.list_tools()
                report["steps"].append({"op": op, "tools": [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in result.tools]})
            elif op == "call":
                progress = []

                async def on_progress(p, total, message, progress=progress):
                    progress.append({"progress": p, "total": total, "message": message})

                try:
                    result = await client.call_tool(
                        step["name"],
                        step.get("args", {}),
                        read_timeout_seconds=step.get("timeout"),
                        progress_callback=on_progress if step.get("progress") else None,
                    )
                    text = "".join(c.text for c in result.content if getattr(c, "type", "") == "text")
                    report["steps"].append({"op": op, "name": step["name"], "is_error": bool(result.is_error), "text": text,
                                            "structured": result.structured_content, "progress": progress})
                except Exception as e:  # the report says what failed; the test asserts on it
                    report["steps"].append({"op": op, "name": step["name"], "error": f"{type(e).__name__}: {e}", "progress": progress})
            elif op in ("resources", "templates", "prompts", "read", "get_prompt", "complete_prompt"):
                try:
                    if op == "resources":
                        r = await client.list_resources()
                    elif op == "templates":
                        r = await client.list_resource_templates()
                    elif op == "prompts":
                        r = await client.list_prompts()
                    elif op == "read":
                        r = await client.read_resource(step["uri"])
                    elif op == "get_prompt":
                        r = await client.get_prompt(step["name"], step.get("args"))
                    else:
                        r = await client.complete(types.PromptReference(type="ref/prompt", name=step["name"]), step["argument"])
                    report["steps"].append({"op": op, "result": r.model_dump(mode="json", by_alias=True, exclude_none=True)})
                except Exception as e:  # the report says what failed; the test asserts on it
                    report["steps"].append({"op": op, "error": f"{type(e).__name__}: {e}"})
            elif op == "touch":
                pathlib.Path(step["path"]).write_text("go")
                report["steps"].append({"op": op})
            elif op == "wait_changed":
                with anyio.move_on_after(step.get("timeout", 10)):
                    await changed.wait()
                changed = anyio.Event()
                report["steps"].append({"op": op, "seen": report["list_changed"]})
            else:
                raise SystemExit(f"unknown step {op!r}")
    print(json.dumps(report))


anyio.run(main)
