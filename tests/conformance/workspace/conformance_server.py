"""The MCP server the conformance suite is run against, hosted by plugd.

plugd serves this server's tools, resources, prompts and completions at
`/mcp/conformance` (plugd.yaml's profile with bare names), and the official
conformance runner (`scripts/conformance`) checks plugd's gateway by calling
them. So everything here is written to the letter of the scenario texts of
@modelcontextprotocol/conformance 0.1.16 (`conformance list`, each
scenario's "Server Implementation Requirements"): a scenario that fails
then fails because of the gateway, not because of this fixture.

Written with the official Python SDK (mcp==2.3.0, its high-level
`MCPServer`), on stdio: plugd starts it from `.mcp.json`.
"""

import asyncio
import base64
import json
import warnings
from typing import Any

import mcp_types as types
from mcp.server.mcpserver import Context, MCPServer, UserMessage
from mcp.server.mcpserver.exceptions import ToolError

# logging/setLevel and resources/subscribe are deprecated by the 2026-07-28
# revision, but the 2025-11-25 scenarios still exercise them.
warnings.simplefilter("ignore")

# A 1x1 red PNG and a 1-sample 8 kHz mono WAV.
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
WAV = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAIA+AAACABAAZGF0YQIAAAAAAA=="

server = MCPServer(name="plugd-conformance", version="1.0.0")
subscriptions: set[str] = set()


def text(s: str) -> types.TextContent:
    return types.TextContent(type="text", text=s)


def image() -> types.ImageContent:
    return types.ImageContent(type="image", data=PNG, mime_type="image/png")


def tool(description: str):
    """A tool whose result is the content it returns, nothing structured."""
    return server.tool(description=description, structured_output=False)


# Tools ----------------------------------------------------------------------


@tool("Returns one text block (tools-call-simple-text).")
def test_simple_text() -> list[types.ContentBlock]:
    return [text("This is a simple text response for testing.")]


@tool("Returns one PNG image (tools-call-image).")
def test_image_content() -> list[types.ContentBlock]:
    return [image()]


@tool("Returns one WAV audio clip (tools-call-audio).")
def test_audio_content() -> list[types.ContentBlock]:
    return [types.AudioContent(type="audio", data=WAV, mime_type="audio/wav")]


@tool("Returns one embedded text resource (tools-call-embedded-resource).")
def test_embedded_resource() -> list[types.ContentBlock]:
    return [
        types.EmbeddedResource(
            type="resource",
            resource=types.TextResourceContents(
                uri="test://embedded-resource",
                mime_type="text/plain",
                text="This is an embedded resource content.",
            ),
        )
    ]


@tool("Returns text, an image and an embedded resource (tools-call-mixed-content).")
def test_multiple_content_types() -> list[types.ContentBlock]:
    return [
        text("Multiple content types test:"),
        image(),
        types.EmbeddedResource(
            type="resource",
            resource=types.TextResourceContents(
                uri="test://mixed-content-resource",
                mime_type="application/json",
                text=json.dumps({"test": "data", "value": 123}),
            ),
        ),
    ]


@tool("Sends three info log messages 50 ms apart (tools-call-with-logging).")
async def test_tool_with_logging(ctx: Context) -> list[types.ContentBlock]:
    await ctx.info("Tool execution started")
    await asyncio.sleep(0.05)
    await ctx.info("Tool processing data")
    await asyncio.sleep(0.05)
    await ctx.info("Tool execution completed")
    return [text("Tool with logging executed successfully")]


@tool("Always fails with isError (tools-call-error).")
def test_error_handling() -> list[types.ContentBlock]:
    raise ToolError("This tool intentionally returns an error for testing")


@tool("Reports progress 0, 50, 100 of 100, 50 ms apart (tools-call-with-progress).")
async def test_tool_with_progress(ctx: Context) -> list[types.ContentBlock]:
    for step, progress in enumerate((0, 50, 100)):
        if step:
            await asyncio.sleep(0.05)
        await ctx.report_progress(progress, 100, f"Completed step {progress} of 100")
    return [text("Tool with progress executed successfully")]


@tool("Asks the client's LLM to answer a prompt (tools-call-sampling).")
async def test_sampling(prompt: str, ctx: Context) -> list[types.ContentBlock]:
    caps = types.ClientCapabilities(sampling=types.SamplingCapability())
    if not ctx.session.check_client_capability(caps):
        raise ToolError("the client does not support sampling (no sampling capability)")
    result = await ctx.session.create_message(
        messages=[types.SamplingMessage(role="user", content=text(prompt))],
        max_tokens=100,
        related_request_id=ctx.request_id,
    )
    content = result.content
    answer = content.text if isinstance(content, types.TextContent) else str(content)
    return [text(f"LLM response: {answer}")]


async def elicit(ctx: Context, message: str, schema: dict[str, Any]) -> types.ElicitResult:
    caps = types.ClientCapabilities(elicitation=types.ElicitationCapability())
    if not ctx.session.check_client_capability(caps):
        raise ToolError("the client does not support elicitation (no elicitation capability)")
    return await ctx.session.elicit_form(
        message=message, requested_schema=schema, related_request_id=ctx.request_id
    )


@tool("Asks the client's user for a username and email (tools-call-elicitation).")
async def test_elicitation(message: str, ctx: Context) -> list[types.ContentBlock]:
    result = await elicit(
        ctx,
        message,
        {
            "type": "object",
            "properties": {
                "username": {"type": "string", "description": "User's response"},
                "email": {"type": "string", "description": "User's email address"},
            },
            "required": ["username", "email"],
        },
    )
    content = json.dumps(result.content or {})
    return [text(f"User response: action={result.action}, content={content}")]


@tool("Elicits a form whose every primitive field has a default (SEP-1034).")
async def test_elicitation_sep1034_defaults(ctx: Context) -> list[types.ContentBlock]:
    result = await elicit(
        ctx,
        "Please review and update the form fields with defaults",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "description": "User name", "default": "John Doe"},
                "age": {"type": "integer", "description": "User age", "default": 30},
                "score": {"type": "number", "description": "User score", "default": 95.5},
                "status": {
                    "type": "string",
                    "description": "User status",
                    "enum": ["active", "inactive", "pending"],
                    "default": "active",
                },
                "verified": {"type": "boolean", "description": "Verification status", "default": True},
            },
            "required": [],
        },
    )
    content = json.dumps(result.content or {})
    return [text(f"Elicitation completed: action={result.action}, content={content}")]


@tool("Elicits a form with all five enum schema forms (SEP-1330).")
async def test_elicitation_sep1330_enums(ctx: Context) -> list[types.ContentBlock]:
    result = await elicit(
        ctx,
        "Please select options from the enum fields",
        {
            "type": "object",
            "properties": {
                "untitledSingle": {
                    "type": "string",
                    "description": "Untitled single-select",
                    "enum": ["option1", "option2", "option3"],
                },
                "titledSingle": {
                    "type": "string",
                    "description": "Titled single-select",
                    "oneOf": [
                        {"const": "value1", "title": "First Option"},
                        {"const": "value2", "title": "Second Option"},
                        {"const": "value3", "title": "Third Option"},
                    ],
                },
                "legacyEnum": {
                    "type": "string",
                    "description": "Legacy titled enum (enumNames, deprecated)",
                    "enum": ["opt1", "opt2", "opt3"],
                    "enumNames": ["Option One", "Option Two", "Option Three"],
                },
                "untitledMulti": {
                    "type": "array",
                    "description": "Untitled multi-select",
                    "items": {"type": "string", "enum": ["option1", "option2", "option3"]},
                },
                "titledMulti": {
                    "type": "array",
                    "description": "Titled multi-select",
                    "items": {
                        "anyOf": [
                            {"const": "value1", "title": "First Choice"},
                            {"const": "value2", "title": "Second Choice"},
                            {"const": "value3", "title": "Third Choice"},
                        ]
                    },
                },
            },
            "required": [],
        },
    )
    content = json.dumps(result.content or {})
    return [text(f"Elicitation completed: action={result.action}, content={content}")]


@tool("Logs before and after a pause (server-sse-polling; the stream is the gateway's).")
async def test_reconnection(ctx: Context) -> list[types.ContentBlock]:
    # Over stdio there is no SSE stream to close: closing the client's
    # stream mid-call (SEP-1699) is the HTTP gateway's business; its
    # fixture closes connections after 1 s (plugd.yaml), within this pause.
    await ctx.info("Before disconnect")
    await asyncio.sleep(1.5)
    await ctx.info("After reconnect")
    return [text("Reconnection test completed")]


@tool("Tool with JSON Schema 2020-12 features")
def json_schema_2020_12_tool(name: str | None = None, address: dict[str, Any] | None = None) -> list[types.ContentBlock]:
    return [text(f"name={name!r}, address={json.dumps(address)}")]


# The scenario checks that $schema, $defs and additionalProperties reach the
# client unchanged, so the listed schema is this one, not the one the SDK
# derives from the signature (which still validates the arguments).
server._tool_manager.get_tool("json_schema_2020_12_tool").parameters = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {
        "address": {
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
        }
    },
    "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"}},
    "additionalProperties": False,
}


# Resources ------------------------------------------------------------------


@server.resource("test://static-text", name="static-text", description="A static text resource", mime_type="text/plain")
def static_text() -> str:
    return "This is the content of the static text resource."


@server.resource(
    "test://static-binary", name="static-binary", description="A static binary resource (PNG)", mime_type="image/png"
)
def static_binary() -> bytes:
    return base64.b64decode(PNG)


@server.resource(
    "test://template/{id}/data",
    name="template-data",
    description="A resource template with one parameter",
    mime_type="application/json",
)
def template_data(id: str) -> str:
    return json.dumps({"id": id, "templateTest": True, "data": f"Data for ID: {id}"})


@server.resource(
    "test://watched-resource", name="watched-resource", description="A resource to subscribe to", mime_type="text/plain"
)
def watched_resource() -> str:
    return "Watched resource content"


async def subscribe(ctx: Any, params: types.SubscribeRequestParams) -> types.EmptyResult:
    subscriptions.add(str(params.uri))
    return types.EmptyResult()


async def unsubscribe(ctx: Any, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
    subscriptions.discard(str(params.uri))
    return types.EmptyResult()


async def set_level(ctx: Any, params: types.SetLevelRequestParams) -> types.EmptyResult:
    return types.EmptyResult()


lowlevel = server._lowlevel_server
lowlevel.add_request_handler("resources/subscribe", types.SubscribeRequestParams, subscribe)
lowlevel.add_request_handler("resources/unsubscribe", types.UnsubscribeRequestParams, unsubscribe)
lowlevel.add_request_handler("logging/setLevel", types.SetLevelRequestParams, set_level)


# Prompts --------------------------------------------------------------------


@server.prompt(description="A simple prompt without arguments")
def test_simple_prompt() -> list[UserMessage]:
    return [UserMessage(text("This is a simple prompt for testing."))]


@server.prompt(description="A prompt with two required arguments")
def test_prompt_with_arguments(arg1: str, arg2: str) -> list[UserMessage]:
    return [UserMessage(text(f"Prompt with arguments: arg1='{arg1}', arg2='{arg2}'"))]


@server.prompt(description="A prompt that embeds a resource")
def test_prompt_with_embedded_resource(resourceUri: str) -> list[UserMessage]:
    return [
        UserMessage(
            types.EmbeddedResource(
                type="resource",
                resource=types.TextResourceContents(
                    uri=resourceUri, mime_type="text/plain", text="Embedded resource content for testing."
                ),
            )
        ),
        UserMessage(text("Please process the embedded resource above.")),
    ]


@server.prompt(description="A prompt with an image")
def test_prompt_with_image() -> list[UserMessage]:
    return [UserMessage(image()), UserMessage(text("Please analyze the image above."))]


# Completion -----------------------------------------------------------------

CANDIDATES = {"arg1": ["paris", "park", "party"], "arg2": ["world", "wonder"], "id": ["123", "456"]}


@server.completion()
async def complete(ref: Any, argument: types.CompletionArgument, context: Any) -> types.Completion:
    values = [v for v in CANDIDATES.get(argument.name, []) if v.startswith(argument.value)]
    return types.Completion(values=values, total=len(values), has_more=False)


if __name__ == "__main__":
    server.run("stdio")
