# nexoai_services: a plugin written with the PyPI `nexoai` SDK that uses every
# host service of the nexo contract from inside its tools: broker.publish,
# memory.recall, llm.complete (plain and streamed), and broker.event delivery.
# Its manifest (written by the tests) names the plugin id; tools are
# `<id>_recall`, `<id>_complete`, `<id>_stream`, `<id>_publish`,
# `<id>_flood`, `<id>_ping`.

import asyncio
import json
import tomllib
from pathlib import Path

from nexo_plugin_sdk import Event, PluginAdapter, ToolDef, text_result

MANIFEST = (Path(__file__).resolve().parent / "nexo-plugin.toml").read_text()
PID = tomllib.loads(MANIFEST)["plugin"]["id"]
OBJ = {"type": "object"}


async def on_tool(inv, ctx):
    args = inv.args if isinstance(inv.args, dict) else {}
    b = ctx.broker
    name = inv.tool_name[len(PID) + 1 :]
    if name == "recall":
        entries = await b.memory_recall(
            agent_id=args["agent"], query=args["query"], limit=args.get("limit", 10)
        )
        return text_result(json.dumps([e.content for e in entries]))
    if name == "complete":
        r = await b.llm_complete(
            provider=args.get("provider", "openai"),
            model="test-model",
            messages=[{"role": "user", "content": args["prompt"]}],
        )
        return text_result(json.dumps({"content": r.content, "finish": r.finish_reason,
                                       "usage": [r.usage.prompt_tokens, r.usage.completion_tokens]}))
    if name == "stream":
        s = b.llm_complete_stream(
            provider="openai",
            model="test-model",
            messages=[{"role": "user", "content": args["prompt"]}],
        )
        chunks = [c async for c in s]
        r = await s.final_result()
        return text_result(json.dumps({"chunks": chunks, "content": r.content,
                                       "finish": r.finish_reason}))
    if name == "publish":
        await b.publish(args["topic"], Event.new(args["topic"], args.get("source", "loop"),
                                                 {"text": args.get("text", "")}))
        return text_result("published")
    if name == "flood":
        for i in range(int(args["n"])):
            await b.publish(args["topic"], Event.new(args["topic"], "loop", {"i": i}))
        return text_result("flooded")
    if name == "ping":
        return text_result("pong")
    raise ValueError(f"unknown tool {inv.tool_name}")


async def on_event(topic, event, broker):
    # Echo every outbound message back inbound, as a channel adapter would.
    text = (event.payload or {}).get("text", "")
    await broker.publish("plugin.inbound.loop",
                         Event.new("plugin.inbound.loop", "loop", {"echo": text, "topic": topic}))


async def main():
    tools = [ToolDef(f"{PID}_{t}", t, OBJ) for t in
             ("recall", "complete", "stream", "publish", "flood", "ping")]
    await PluginAdapter(manifest_toml=MANIFEST, server_version="svc-1", tools=tools,
                        on_event=on_event).on_tool_with_context(on_tool).run()


asyncio.run(main())
