# typed_errors.py: a native plugin on the nexoai SDK whose tool raises each typed tool error (-33401..-33405) on demand.
"""
Tool `typed_raise {kind, retry_after_ms?}`:
  not_found    -> ToolNotFound            (-33401)
  invalid      -> ToolArgumentInvalid     (-33402, details {"field": "city", "why": "missing"})
  failed       -> ToolExecutionFailed     (-33403)
  unavailable  -> ToolUnavailable         (-33404, retry_after_ms passed through as given:
                                           the tests send lies: negative, string, 1e308, huge)
  denied       -> ToolDenied              (-33405)
  ok           -> text "fine"
The manifest (nexo-plugin.toml next to it) declares `typed_raise`.
"""

import asyncio
import os

from nexo_plugin_sdk import (
    PluginAdapter,
    ToolArgumentInvalid,
    ToolDef,
    ToolDenied,
    ToolExecutionFailed,
    ToolInvocation,
    ToolNotFound,
    ToolUnavailable,
    text_result,
)

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "nexo-plugin.toml")) as f:
    MANIFEST = f.read()


async def on_tool(inv: ToolInvocation):
    args = inv.args or {}
    kind = args.get("kind")
    if kind == "not_found":
        raise ToolNotFound(inv.tool_name)
    if kind == "invalid":
        raise ToolArgumentInvalid("city is missing", details={"field": "city", "why": "missing"})
    if kind == "failed":
        raise ToolExecutionFailed("upstream API returned 500")
    if kind == "unavailable":
        raise ToolUnavailable("rate limited", retry_after_ms=args.get("retry_after_ms"))
    if kind == "denied":
        raise ToolDenied("tenant acme may not call this")
    return text_result("fine")


async def main() -> None:
    await PluginAdapter(
        manifest_toml=MANIFEST,
        tools=[
            ToolDef(
                "typed_raise",
                "Raise the typed tool error named by kind",
                {
                    "type": "object",
                    "properties": {"kind": {"type": "string"}, "retry_after_ms": {}},
                    "required": ["kind"],
                },
            )
        ],
        on_tool=on_tool,
    ).run()


asyncio.run(main())
