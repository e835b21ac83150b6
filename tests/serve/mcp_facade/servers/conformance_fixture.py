"""The conformance suite's fixture contract as a Python MCP server (lowlevel SDK `Server`).

The `@modelcontextprotocol/conformance` server scenarios test fixed names (see its scenario
sources): tools `test_*` and `json_schema_2020_12_tool`, resources `test://...`, prompts
`test_*_prompt*` and completion on `test_prompt_with_arguments`. `scripts/conformance` puts this
server upstream of the sidecar (namespace "") and runs the suite through `/mcp`.

    python conformance_fixture.py            # stdio (how the sidecar runs it)

Extra tools for the facade tests: `test_big_text(size)` (a large text result) and
`test_structured(value)` (structuredContent that is not an object when `value` is a list),
`test_roots` (asks the client for its roots; also reports the roots it fetched after the last
`notifications/roots/list_changed`), `test_sleep(seconds)`, `test_update_resource(uri)` (says
that resource `uri` changed: to the 2026-07-28 `subscriptions/listen` streams that asked for it,
and to the calling handshake-era session when it subscribed to it).

On a 2026-07-28 connection a server cannot send requests to the client: sampling, elicitation
and roots are asked with an `input_required` result instead, and answered by the client's retry.
"""

from __future__ import annotations

import base64
import json
import warnings
from typing import Any

import anyio
import mcp_types as types
from mcp.server import NotificationOptions, Server
from mcp.server.stdio import stdio_server
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ResourceUpdated
from mcp.shared.message import ServerMessageMetadata
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

warnings.simplefilter("ignore")  # the SDK marks sampling/logging/roots deprecated in 2026

PNG = base64.b64encode(bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c63f8cfc0f01f0005000201e2f0a0d80000000049454e44ae426082"
)).decode()
WAV = base64.b64encode(
    b"RIFF$\x00\x00\x00WAVEfmt \x10\x00\x00\x00\x01\x00\x01\x00D\xac\x00\x00\x88X\x01\x00"
    b"\x02\x00\x10\x00data\x00\x00\x00\x00"
).decode()
OBJ: dict[str, Any] = {"type": "object", "properties": {}}
SCHEMA_2020 = "https://json-schema.org/draft/2020-12/schema"


def _tool(name: str, description: str, schema: dict[str, Any] | None = None,
          output: dict[str, Any] | None = None) -> types.Tool:
    return types.Tool(name=name, description=description, input_schema=schema or OBJ,
                      output_schema=output)


def _str_args(*names: str) -> dict[str, Any]:
    return {"type": "object", "properties": {n: {"type": "string"} for n in names},
            "required": list(names)}


TOOLS = [
    _tool("test_simple_text", "Returns simple text"),
    _tool("test_image_content", "Returns an image"),
    _tool("test_audio_content", "Returns audio"),
    _tool("test_embedded_resource", "Returns an embedded resource"),
    _tool("test_multiple_content_types", "Returns text, image and resource"),
    _tool("test_tool_with_logging", "Logs three messages while running"),
    _tool("test_tool_with_progress", "Reports progress 0, 50, 100 of 100"),
    _tool("test_error_handling", "Always fails"),
    _tool("test_sampling", "Asks the client for a completion", _str_args("prompt")),
    _tool("test_elicitation", "Asks the user for input", _str_args("message")),
    _tool("test_elicitation_sep1034_defaults", "Elicitation with defaults"),
    _tool("test_elicitation_sep1330_enums", "Elicitation with enum variants"),
    _tool("json_schema_2020_12_tool", "Tool with JSON Schema 2020-12 features", {
        "$schema": SCHEMA_2020, "type": "object",
        "$defs": {"address": {"type": "object", "properties": {
            "street": {"type": "string"}, "city": {"type": "string"}}}},
        "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"}},
        "additionalProperties": False,
    }),
    _tool("test_reconnection", "Returns after a short pause"),
    _tool("test_big_text", "Returns `size` bytes of text in lines",
          {"type": "object", "properties": {"size": {"type": "integer"}}, "required": ["size"]}),
    _tool("test_structured", "Returns `value` as structuredContent",
          {"type": "object", "properties": {"value": {}}, "required": ["value"]},
          output={"type": "object", "properties": {"value": {}}}),
    _tool("test_roots", "Asks the client for its roots"),
    _tool("test_sleep", "Sleeps `seconds`",
          {"type": "object", "properties": {"seconds": {"type": "number"}},
           "required": ["seconds"]}),
    _tool("test_update_resource", "Announces that resource `uri` changed", _str_args("uri")),
]

ELICIT_DEFAULTS = {"type": "object", "properties": {
    "name": {"type": "string", "default": "John Doe"},
    "age": {"type": "integer", "default": 30},
    "score": {"type": "number", "default": 95.5},
    "status": {"type": "string", "enum": ["active", "inactive", "pending"], "default": "active"},
    "verified": {"type": "boolean", "default": True},
}}
ELICIT_ENUMS = {"type": "object", "properties": {
    "untitledSingle": {"type": "string", "enum": ["option1", "option2", "option3"]},
    "titledSingle": {"type": "string", "oneOf": [
        {"const": "value1", "title": "First Option"}, {"const": "value2", "title": "Second Option"},
        {"const": "value3", "title": "Third Option"}]},
    "legacyEnum": {"type": "string", "enum": ["opt1", "opt2", "opt3"],
                   "enumNames": ["Option One", "Option Two", "Option Three"]},
    "untitledMulti": {"type": "array", "items": {"type": "string",
                                                 "enum": ["option1", "option2", "option3"]}},
    "titledMulti": {"type": "array", "items": {"anyOf": [
        {"const": "value1", "title": "First Choice"}, {"const": "value2", "title": "Second Choice"},
        {"const": "value3", "title": "Third Choice"}]}},
}}
SUBSCRIPTIONS: set[str] = set()
BUS = InMemorySubscriptionBus()


def text(value: str) -> types.TextContent:
    return types.TextContent(text=value)


def result(*content: Any, is_error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(content=list(content), is_error=is_error)


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


ROOTS_AFTER_CHANGE: list[str] = []


class Ask(Exception):
    """A 2026-07-28 call that must first ask the client (becomes an input_required result)."""

    def __init__(self, key: str, request: Any) -> None:
        self.key = key
        self.request = request


async def _ask(ctx: Any, params: Any, key: str, request: Any, result_type: Any) -> Any:
    """The client's answer to `request`: a server-to-client request in the handshake era, an
    `input_required` round (raising `Ask` until the retry carries the answer) in 2026-07-28."""
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        answer = (params.input_responses or {}).get(key)
        if answer is None:
            raise Ask(key, request)
        return answer
    return await ctx.session.send_request(
        request, result_type, metadata=ServerMessageMetadata(related_request_id=ctx.request_id))


async def _elicit(ctx: Any, params: Any, message: str, schema: dict[str, Any]) -> Any:
    return await _ask(ctx, params, "elicit", types.ElicitRequest(
        params=types.ElicitRequestFormParams(message=message, requested_schema=schema)),
        types.ElicitResult)


async def call_tool(
    ctx: Any, params: types.CallToolRequestParams
) -> types.CallToolResult | types.InputRequiredResult:
    try:
        return await _call_tool(ctx, params)
    except Ask as ask:
        return types.InputRequiredResult(input_requests={ask.key: ask.request},
                                         request_state=f"asked-{ask.key}")


async def _call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    args = params.arguments or {}
    name = params.name
    if name == "test_simple_text":
        return result(text("This is a simple text response for testing."))
    if name == "test_image_content":
        return result(types.ImageContent(data=PNG, mime_type="image/png"))
    if name == "test_audio_content":
        return result(types.AudioContent(data=WAV, mime_type="audio/wav"))
    if name == "test_embedded_resource":
        return result(types.EmbeddedResource(resource=types.TextResourceContents(
            uri="test://embedded-resource", mime_type="text/plain",
            text="This is an embedded resource content.")))
    if name == "test_multiple_content_types":
        return result(
            text("Multiple content types test:"),
            types.ImageContent(data=PNG, mime_type="image/png"),
            types.EmbeddedResource(resource=types.TextResourceContents(
                uri="test://mixed-content-resource", mime_type="application/json",
                text=json.dumps({"test": "data", "value": 123}))),
        )
    if name == "test_tool_with_logging":
        for i, message in enumerate(
            ("Tool execution started", "Tool processing data", "Tool execution completed")
        ):
            if i:
                await anyio.sleep(0.05)
            await ctx.session.send_log_message(
                "info", message, logger="conformance", related_request_id=ctx.request_id)
        return result(text("Tool with logging executed successfully"))
    if name == "test_tool_with_progress":
        for i, value in enumerate((0, 50, 100)):
            if i:
                await anyio.sleep(0.05)
            await ctx.session.report_progress(value, 100, f"step {i + 1}")
        return result(text("Tool with progress executed successfully"))
    if name == "test_error_handling":
        return result(text("This tool intentionally returns an error for testing"), is_error=True)
    if name == "test_sampling":
        answer = await _ask(ctx, params, "sample", types.CreateMessageRequest(
            params=types.CreateMessageRequestParams(
                messages=[types.SamplingMessage(role="user", content=text(str(args["prompt"])))],
                max_tokens=100)), types.CreateMessageResult)
        reply = answer.content
        said = reply.text if isinstance(reply, types.TextContent) else str(reply)
        return result(text(f"LLM response: {said}"))
    if name == "test_elicitation":
        schema = {"type": "object", "properties": {
            "username": {"type": "string", "description": "User's response"},
            "email": {"type": "string", "description": "User's email address"}},
            "required": ["username", "email"]}
        answer = await _elicit(ctx, params, str(args["message"]), schema)
        return result(text(f"User response: action={answer.action}, content="
                           f"{json.dumps(answer.content)}"))
    if name in ("test_elicitation_sep1034_defaults", "test_elicitation_sep1330_enums"):
        schema = ELICIT_DEFAULTS if name.endswith("defaults") else ELICIT_ENUMS
        answer = await _elicit(ctx, params, "Please review and update the form fields", schema)
        return result(text(f"Elicitation completed: action={answer.action}, content="
                           f"{json.dumps(answer.content)}"))
    if name == "test_roots":
        roots = await _ask(ctx, params, "roots", types.ListRootsRequest(), types.ListRootsResult)
        return result(text(json.dumps({"roots": [str(r.uri) for r in roots.roots],
                                       "after_change": ROOTS_AFTER_CHANGE})))
    if name == "test_sleep":
        await anyio.sleep(float(args["seconds"]))
        return result(text("slept"))
    if name == "test_update_resource":
        uri = str(args["uri"])
        await BUS.publish(ResourceUpdated(uri=uri))
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS and uri in SUBSCRIPTIONS:
            await ctx.session.send_resource_updated(uri)
        return result(text(f"updated {uri}"))
    if name == "json_schema_2020_12_tool":
        return result(text(f"received {json.dumps(args)}"))
    if name == "test_reconnection":
        await anyio.sleep(0.1)
        return result(text("Reconnection test completed"))
    if name == "test_big_text":
        size = int(args["size"])
        line = "x" * 99 + "\n"
        return result(text((line * (size // 100 + 1))[:size]))
    if name == "test_structured":
        return types.CallToolResult(content=[text(json.dumps(args["value"]))],
                                    structured_content={"value": args["value"]})
    return result(text(f"unknown tool {name}"), is_error=True)


RESOURCES = [
    types.Resource(uri="test://static-text", name="static-text", description="Static text",
                   mime_type="text/plain"),
    types.Resource(uri="test://static-binary", name="static-binary",
                   description="Static binary", mime_type="image/png"),
    types.Resource(uri="test://watched-resource", name="watched-resource",
                   description="A resource clients may subscribe to", mime_type="text/plain"),
]


async def list_resources(ctx: Any, params: Any) -> types.ListResourcesResult:
    return types.ListResourcesResult(resources=RESOURCES)


async def list_templates(ctx: Any, params: Any) -> types.ListResourceTemplatesResult:
    return types.ListResourceTemplatesResult(resource_templates=[types.ResourceTemplate(
        uri_template="test://template/{id}/data", name="template",
        description="Data by id", mime_type="application/json")])


async def read_resource(
    ctx: Any, params: types.ReadResourceRequestParams
) -> types.ReadResourceResult:
    uri = str(params.uri)
    contents: types.TextResourceContents | types.BlobResourceContents
    if uri == "test://static-text":
        contents = types.TextResourceContents(
            uri=uri, mime_type="text/plain",
            text="This is the content of the static text resource.")
    elif uri == "test://static-binary":
        contents = types.BlobResourceContents(uri=uri, mime_type="image/png", blob=PNG)
    elif uri == "test://watched-resource":
        contents = types.TextResourceContents(uri=uri, mime_type="text/plain", text="watched")
    elif uri.startswith("test://template/") and uri.endswith("/data"):
        ident = uri[len("test://template/"):-len("/data")]
        data = {"id": ident, "templateTest": True, "data": f"Data for ID: {ident}"}
        contents = types.TextResourceContents(
            uri=uri, mime_type="application/json", text=json.dumps(data))
    else:
        raise ValueError(f"unknown resource {uri}")
    return types.ReadResourceResult(contents=[contents])


async def subscribe(ctx: Any, params: types.SubscribeRequestParams) -> types.EmptyResult:
    SUBSCRIPTIONS.add(str(params.uri))
    await ctx.session.send_resource_updated(str(params.uri))
    return types.EmptyResult()


async def unsubscribe(ctx: Any, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
    SUBSCRIPTIONS.discard(str(params.uri))
    return types.EmptyResult()


PROMPTS = [
    types.Prompt(name="test_simple_prompt", description="A simple prompt"),
    types.Prompt(name="test_prompt_with_arguments", description="A prompt with arguments",
                 arguments=[types.PromptArgument(name="arg1", required=True),
                            types.PromptArgument(name="arg2", required=True)]),
    types.Prompt(name="test_prompt_with_embedded_resource", description="Embeds a resource",
                 arguments=[types.PromptArgument(name="resourceUri", required=True)]),
    types.Prompt(name="test_prompt_with_image", description="A prompt with an image"),
]


async def list_prompts(ctx: Any, params: Any) -> types.ListPromptsResult:
    return types.ListPromptsResult(prompts=PROMPTS)


def _user(content: Any) -> types.PromptMessage:
    return types.PromptMessage(role="user", content=content)


async def get_prompt(ctx: Any, params: types.GetPromptRequestParams) -> types.GetPromptResult:
    args = params.arguments or {}
    if params.name == "test_simple_prompt":
        messages = [_user(text("This is a simple prompt for testing."))]
    elif params.name == "test_prompt_with_arguments":
        messages = [_user(text(
            f"Prompt with arguments: arg1='{args.get('arg1')}', arg2='{args.get('arg2')}'"))]
    elif params.name == "test_prompt_with_embedded_resource":
        messages = [
            _user(types.EmbeddedResource(resource=types.TextResourceContents(
                uri=args.get("resourceUri", "test://example-resource"), mime_type="text/plain",
                text="Embedded resource content for testing."))),
            _user(text("Please process the embedded resource above.")),
        ]
    elif params.name == "test_prompt_with_image":
        messages = [_user(types.ImageContent(data=PNG, mime_type="image/png")),
                    _user(text("Please analyze the image above."))]
    else:
        raise ValueError(f"unknown prompt {params.name}")
    return types.GetPromptResult(messages=messages)


async def complete(ctx: Any, params: types.CompleteRequestParams) -> types.CompleteResult:
    prefix = params.argument.value
    values = [v for v in ("paris", "park", "party") if v.startswith(prefix)]
    return types.CompleteResult(completion=types.Completion(values=values, total=len(values),
                                                            has_more=False))


async def set_level(ctx: Any, params: types.SetLevelRequestParams) -> types.EmptyResult:
    return types.EmptyResult()


async def roots_changed(ctx: Any, params: Any) -> None:
    roots = await ctx.session.send_request(types.ListRootsRequest(), types.ListRootsResult)
    ROOTS_AFTER_CHANGE[:] = [str(r.uri) for r in roots.roots]


def build_server() -> Server[Any]:
    return Server(
        "conformance-fixture", version="1.0.0",
        on_list_tools=list_tools, on_call_tool=call_tool,
        on_list_resources=list_resources, on_list_resource_templates=list_templates,
        on_read_resource=read_resource, on_subscribe_resource=subscribe,
        on_unsubscribe_resource=unsubscribe, on_list_prompts=list_prompts,
        on_get_prompt=get_prompt, on_completion=complete, on_set_logging_level=set_level,
        on_roots_list_changed=roots_changed, on_subscriptions_listen=ListenHandler(BUS),
    )


async def main() -> None:
    server = build_server()
    options = server.create_initialization_options(NotificationOptions(
        tools_changed=True, resources_changed=True, prompts_changed=True))
    async with stdio_server() as (read, write):
        await server.run(read, write, options)


if __name__ == "__main__":
    anyio.run(main)
