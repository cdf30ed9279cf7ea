"""The MCP server the conformance suite is run against, hosted by plugd.

plugd serves this server's tools, resources, prompts and completions at
`/mcp/conformance` (plugd.yaml's profile with bare names), and the official
conformance runner (`scripts/conformance`) checks plugd's gateway by calling
them. So everything here is written to the letter of the scenario texts of
@modelcontextprotocol/conformance 0.1.16 and, for the 2026-07-28 revision,
0.2.0-alpha.12 (`conformance list`, each scenario's "Server Implementation
Requirements"; the second hosting of this script, spoken to statelessly,
at `/mcp/conformance-2026-07-28`): a scenario that fails then fails because
of the gateway, not because of this fixture.

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
from mcp.server.mcpserver.prompts import Prompt
from mcp.shared.exceptions import MCPError

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


# The scenario checks that $schema, $defs and additionalProperties (SEP-1613)
# and, from 2026-07-28, $anchor, allOf/anyOf and if/then/else (SEP-2106)
# reach the client unchanged, so the listed schema is the suite's own, not
# the one the SDK derives from the signature (which still validates the
# arguments).
server._tool_manager.get_tool("json_schema_2020_12_tool").parameters = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {
        "address": {
            "$anchor": "addressDef",
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
        }
    },
    "properties": {
        "name": {"type": "string"},
        "address": {"$ref": "#/$defs/address"},
        "contactMethod": {"type": "string", "enum": ["phone", "email"]},
        "phone": {"type": "string"},
        "email": {"type": "string"},
    },
    "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
    "if": {"properties": {"contactMethod": {"const": "phone"}}, "required": ["contactMethod"]},
    "then": {"required": ["phone"]},
    "else": {"required": ["email"]},
    "additionalProperties": False,
}


@tool("Echoes its region, which clients mirror into the Mcp-Param-Region header (SEP-2243).")
def test_custom_header_param(region: str = "", priority: int = 0) -> list[types.ContentBlock]:
    return [text(f"region={region!r}, priority={priority}")]


# The x-mcp-header annotations are in the listed schema only (the SDK's own
# schema does not carry them).
server._tool_manager.get_tool("test_custom_header_param").parameters = {
    "type": "object",
    "properties": {
        "region": {"type": "string", "x-mcp-header": "Region"},
        "priority": {"type": "integer", "x-mcp-header": "Priority"},
    },
}


# Multi-round-trip requests (2026-07-28, SEP-2322) ---------------------------
#
# Served through the stateless hosting of this script (`.mcp.json`'s
# conformance-stateless, plugd.yaml `stateless: true`): plugd speaks
# 2026-07-28 to it, so what these return reaches the suite's client through
# plugd, and the client's `inputResponses` and `requestState` reach these
# through plugd. The SDK seals every `requestState` (AES-GCM, process key),
# so a tampered one is refused with -32602 before a handler runs.

Answers = dict[str, Any]


def answers(ctx: Context) -> Answers:
    """The call's inputResponses as plain JSON (the SDK parses them)."""
    out: Answers = {}
    for key, value in (ctx.input_responses or {}).items():
        out[key] = value.model_dump(by_alias=True, exclude_none=True) if hasattr(value, "model_dump") else value
    return out


def ask_name(key: str = "user_name", message: str = "What is your name?", field: str = "name") -> dict[str, Any]:
    return {
        key: {
            "method": "elicitation/create",
            "params": {
                "message": message,
                "requestedSchema": {"type": "object", "properties": {field: {"type": "string"}}, "required": [field]},
            },
        }
    }


def accepted(answer: Any, field: str) -> Any:
    """The accepted elicitation's `field`, or None for anything else."""
    if not isinstance(answer, dict) or answer.get("action") != "accept":
        return None
    content = answer.get("content")
    return content.get(field) if isinstance(content, dict) else None


def sampled_text(answer: Any) -> str | None:
    content = answer.get("content") if isinstance(answer, dict) else None
    if isinstance(content, list):
        content = next((c for c in content if isinstance(c, dict)), None)
    return content.get("text") if isinstance(content, dict) else None


def input_required(requests: dict[str, Any], state: str = "round-1") -> types.InputRequiredResult:
    # Always with a requestState: the SDK (mcp 2.3.0) answers nothing at all
    # to a tools/call whose InputRequiredResult has none.
    return types.InputRequiredResult.model_validate({"inputRequests": requests, "requestState": state})


SAMPLE_CAPITAL = {
    "capital_question": {
        "method": "sampling/createMessage",
        "params": {
            "messages": [{"role": "user", "content": {"type": "text", "text": "What is the capital of France?"}}],
            "maxTokens": 100,
        },
    }
}
ROOTS = {"client_roots": {"method": "roots/list", "params": {}}}


@tool("Asks the user's name with input_required, then greets them (input-required-result-*).")
def test_input_required_result_elicitation(ctx: Context) -> list[types.ContentBlock] | types.InputRequiredResult:
    name = accepted(answers(ctx).get("user_name"), "name")
    if not isinstance(name, str):
        return input_required(ask_name())
    return [text(f"Hello, {name}!")]


@tool("Asks a sampling question with input_required, then returns the answer.")
def test_input_required_result_sampling(ctx: Context) -> list[types.ContentBlock] | types.InputRequiredResult:
    said = sampled_text(answers(ctx).get("capital_question"))
    if said is None:
        return input_required(SAMPLE_CAPITAL)
    return [text(f"The model said: {said}")]


@tool("Asks for the client's roots with input_required, then lists them.")
def test_input_required_result_list_roots(ctx: Context) -> list[types.ContentBlock] | types.InputRequiredResult:
    roots = answers(ctx).get("client_roots")
    if not isinstance(roots, dict) or not isinstance(roots.get("roots"), list):
        return input_required(ROOTS)
    uris = [r.get("uri") for r in roots["roots"] if isinstance(r, dict)]
    return [text(f"Client roots: {', '.join(map(str, uris)) or '(none)'}")]


@tool("Asks for confirmation with requestState, then checks the state came back.")
def test_input_required_result_request_state(ctx: Context) -> list[types.ContentBlock] | types.InputRequiredResult:
    ok = accepted(answers(ctx).get("confirm"), "ok")
    if ctx.request_state != "confirm-round-1" or not isinstance(ok, bool):
        request = ask_name("confirm", "Please confirm", "ok")
        request["confirm"]["params"]["requestedSchema"]["properties"]["ok"] = {"type": "boolean"}
        return input_required(request, "confirm-round-1")
    return [text(f"state-ok: confirmed={ok}")]


@tool("Asks three things at once (elicitation, sampling, roots) with requestState.")
def test_input_required_result_multiple_inputs(ctx: Context) -> list[types.ContentBlock] | types.InputRequiredResult:
    got = answers(ctx)
    name = accepted(got.get("user_name"), "name")
    greeting = sampled_text(got.get("greeting"))
    roots = got.get("client_roots")
    if ctx.request_state != "multiple-round-1" or name is None or greeting is None or not isinstance(roots, dict):
        requests = {
            **ask_name(),
            "greeting": {
                "method": "sampling/createMessage",
                "params": {
                    "messages": [{"role": "user", "content": {"type": "text", "text": "Generate a greeting"}}],
                    "maxTokens": 50,
                },
            },
            **ROOTS,
        }
        return input_required(requests, "multiple-round-1")
    return [text(f"name={name}, greeting={greeting}, roots={len(roots.get('roots') or [])}")]


@tool("Two rounds of questions, the requestState changing between them.")
def test_input_required_result_multi_round(ctx: Context) -> list[types.ContentBlock] | types.InputRequiredResult:
    got = answers(ctx)
    if ctx.request_state == "round-2":
        color = accepted(got.get("step2"), "color")
        if isinstance(color, str):
            return [text(f"Multi-round complete: favorite color {color}")]
    if ctx.request_state == "round-1":
        name = accepted(got.get("step1"), "name")
        if isinstance(name, str):
            return input_required(ask_name("step2", "Step 2: What is your favorite color?", "color"), "round-2")
    return input_required(ask_name("step1", "Step 1: What is your name?"), "round-1")


@tool("Asks with integrity-protected requestState; a tampered state is refused (-32602).")
def test_input_required_result_tampered_state(ctx: Context) -> list[types.ContentBlock] | types.InputRequiredResult:
    name = accepted(answers(ctx).get("user_name"), "name")
    if ctx.request_state != "tamper-round-1" or not isinstance(name, str):
        return input_required(ask_name(), "tamper-round-1")
    return [text(f"Hello, {name}! (state verified)")]


def client_has(ctx: Context, capability: str) -> bool:
    """Whether the request's client declared `capability` (2026-07-28:
    the client plugd relays the call for, in `_meta`)."""
    caps = ctx.client_capabilities
    return caps is not None and getattr(caps, capability, None) is not None


@tool("Asks only what the client declared it can answer (sampling, elicitation).")
def test_input_required_result_capabilities(ctx: Context) -> list[types.ContentBlock] | types.InputRequiredResult:
    got = answers(ctx)
    requests: dict[str, Any] = {}
    if client_has(ctx, "sampling") and sampled_text(got.get("capital_question")) is None:
        requests.update(SAMPLE_CAPITAL)
    if client_has(ctx, "elicitation") and accepted(got.get("user_name"), "name") is None:
        requests.update(ask_name())
    if requests:
        return input_required(requests)
    return [text("Asked only what the client can answer")]


# server-stateless (SEP-2575) --------------------------------------------------


@tool("Needs sampling: refused with -32021 when the client did not declare it.")
def test_missing_capability(ctx: Context) -> list[types.ContentBlock] | types.InputRequiredResult:
    if not client_has(ctx, "sampling"):
        raise MCPError(
            code=-32021,
            message="test_missing_capability needs the sampling capability, which the client did not declare",
            data={"requiredCapabilities": {"sampling": {}}},
        )
    said = sampled_text(answers(ctx).get("capital_question"))
    if said is None:
        return input_required(SAMPLE_CAPITAL)
    return [text(f"The model said: {said}")]


@tool("Asks the user's name; on 2026-07-28 that is an input_required result, never a request.")
def test_streaming_elicitation(ctx: Context) -> list[types.ContentBlock] | types.InputRequiredResult:
    name = accepted(answers(ctx).get("user_name"), "name")
    if not isinstance(name, str):
        return input_required(ask_name())
    return [text(f"Hello, {name}!")]


@tool("Logs one message, then answers (sent only to a client that set a log level).")
async def test_logging_tool(ctx: Context) -> list[types.ContentBlock]:
    await ctx.info("test_logging_tool ran")
    return [text("Logged one message")]


def changing_tool() -> list[types.ContentBlock]:
    return [text("A tool that comes and goes")]


def changing_prompt() -> list[UserMessage]:
    return [UserMessage(text("A prompt that comes and goes"))]


@tool("Adds or removes a tool, so the tool list changes (tools/list_changed).")
async def test_trigger_tool_change(ctx: Context) -> list[types.ContentBlock]:
    if server._tool_manager.get_tool("test_changing_tool") is None:
        server.add_tool(changing_tool, name="test_changing_tool", description="Comes and goes")
    else:
        server.remove_tool("test_changing_tool")
    await ctx.session.send_tool_list_changed()  # a session's stream (2025-11-25)
    await ctx.notify_tools_changed()  # subscriptions/listen streams (2026-07-28)
    return [text("The tool list changed")]


@tool("Adds or removes a prompt, so the prompt list changes (prompts/list_changed).")
async def test_trigger_prompt_change(ctx: Context) -> list[types.ContentBlock]:
    if "test_changing_prompt" in {p.name for p in server._prompt_manager.list_prompts()}:
        server.remove_prompt("test_changing_prompt")
    else:
        server.add_prompt(
            Prompt.from_function(changing_prompt, name="test_changing_prompt", description="Comes and goes")
        )
    await ctx.session.send_prompt_list_changed()
    await ctx.notify_prompts_changed()
    return [text("The prompt list changed")]


@server.prompt(description="A prompt that asks for its context with input_required (SEP-2322)")
def test_input_required_result_prompt(ctx: Context) -> list[UserMessage] | types.InputRequiredResult:
    context = accepted(answers(ctx).get("user_context"), "context")
    if not isinstance(context, str):
        return input_required(ask_name("user_context", "What context should the prompt use?", "context"))
    return [UserMessage(text(f"Use this context: {context}"))]


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
