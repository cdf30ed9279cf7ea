# hello-nexoai: a plugd/nexo plugin written with the third-party `nexoai` 0.4.0 SDK (contract §9.5).

import asyncio
from pathlib import Path

from nexo_plugin_sdk import (
    PluginAdapter,
    ToolArgumentInvalid,
    ToolDef,
    ToolInvocation,
    text_result,
)

MANIFEST = (Path(__file__).resolve().parent / "nexo-plugin.toml").read_text()


async def on_tool(inv: ToolInvocation):
    city = (inv.args or {}).get("city") if isinstance(inv.args, dict) else None
    if not isinstance(city, str) or not city:
        raise ToolArgumentInvalid("missing `city`", details={"field": "city"})
    return text_result(f"Sunny in {city}")


async def main() -> None:
    await PluginAdapter(
        manifest_toml=MANIFEST,
        server_version="hello_nexoai-0.1.0",
        tools=[
            ToolDef(
                "hello_nexoai_weather",
                "Current weather for a city (always sunny)",
                {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                },
            )
        ],
        on_tool=on_tool,
    ).run()


asyncio.run(main())
