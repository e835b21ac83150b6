"""The facade on /mcp: both eras, results, relays, security, list_changed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from sidecar import Tool, ToolResponse
from sidecar.serve.mcp_facade import CALL_ID_KEY
from tests.serve.mcp_facade.conftest import TOKEN, EchoIn, Served

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def connect(url: str, mode: str, **kwargs: Any) -> AsyncIterator[Client]:
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"},
                                  timeout=httpx2.Timeout(30)) as http:
        async with Client(streamable_http_client(url, http_client=http), mode=mode,
                          cache=None, **kwargs) as client:
            yield client


async def raw_call(client: Client, name: str, arguments: dict[str, Any],
                   meta: dict[str, Any] | None = None) -> types.CallToolResult:
    params = types.CallToolRequestParams(name=name, arguments=arguments, _meta=meta)
    return await client.session.send_request(types.CallToolRequest(params=params),
                                             types.CallToolResult)


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_tools_list_and_call_in_both_eras(served: Served, mode: str) -> None:
    async with connect(served.url, mode) as client:
        listed = {t.name: t for t in (await client.list_tools()).tools}
        assert {"echo", "numbers", "managed_read", "test_simple_text"} <= set(listed)
        assert listed["echo"].input_schema["properties"]["text"]["type"] == "string"
        result = await raw_call(client, "echo", {"text": "hi"}, {CALL_ID_KEY: f"c-{mode}"})
        assert result.structured_content == {"echoed": "hi"}
        assert not result.is_error
        assert (await served.location.outcome(f"c-{mode}")) is not None
        numbers = await raw_call(client, "numbers", {"text": "x"})
        if mode == "legacy":
            assert numbers.structured_content == {"result": [1, 2, 3]}
            schema = listed["numbers"].meta["sidecar/outputSchema"]  # bounded: not outputSchema
            assert schema["properties"]["result"]["type"] == "array"
        else:
            assert numbers.structured_content == [1, 2, 3]
        upstream = await raw_call(client, "test_simple_text", {})
        assert upstream.content[0].text == "This is a simple text response for testing."
        failed = await raw_call(client, "test_error_handling", {})
        assert failed.is_error
        invalid = await raw_call(client, "echo", {"text": 5})
        assert invalid.is_error and "text" in invalid.content[0].text


async def test_big_upstream_result_is_bounded_with_managed_read(served: Served) -> None:
    async with connect(served.url, "legacy") as client:
        await client.list_tools()
        result = await raw_call(client, "test_big_text", {"size": 5_000_000})
        text = result.content[0].text
        assert len(text.encode()) <= 60 * 1024
        managed = result.meta["sidecar/managed"][0]
        ref = managed.get("ref") or managed.get("id")
        read = await raw_call(client, "managed_read", {"ref": ref, "offset": 1, "limit": 10})
        assert not read.is_error, read.content
        assert "xxxx" in read.content[0].text


async def test_relays_sampling_elicitation_progress_logging(served: Served) -> None:
    seen: dict[str, Any] = {"progress": [], "logs": []}

    async def sampling(ctx: Any, params: types.CreateMessageRequestParams) -> Any:
        seen["sampling"] = params.messages[0].content.text
        return types.CreateMessageResult(role="assistant", model="m",
                                         content=types.TextContent(text="42"))

    async def elicitation(ctx: Any, params: types.ElicitRequestParams) -> Any:
        seen["elicitation"] = params.message
        return types.ElicitResult(action="accept", content={"username": "u", "email": "e"})

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        seen["logs"].append(params.data)

    async with connect(served.url, "legacy", sampling_callback=sampling,
                       elicitation_callback=elicitation, logging_callback=on_log) as client:
        await client.list_tools()
        sampled = await raw_call(client, "test_sampling", {"prompt": "the question"})
        assert sampled.content[0].text == "LLM response: 42"
        assert seen["sampling"] == "the question"
        elicited = await raw_call(client, "test_elicitation", {"message": "who?"})
        assert "accept" in elicited.content[0].text and seen["elicitation"] == "who?"

        async def progress(value: float, total: float | None, message: str | None) -> None:
            seen["progress"].append((value, total))

        await client.call_tool("test_tool_with_progress", {}, progress_callback=progress)
        assert seen["progress"] == [(0, 100), (50, 100), (100, 100)]
        await client.call_tool("test_tool_with_logging", {})
        with anyio.fail_after(5):
            while len(seen["logs"]) < 3:  # noqa: ASYNC110
                await anyio.sleep(0.02)
        assert seen["logs"][0] == "Tool execution started"


async def test_sampling_without_client_support_is_a_clear_error(served: Served) -> None:
    async with connect(served.url, "legacy") as client:
        result = await raw_call(client, "test_sampling", {"prompt": "q"})
        assert result.is_error
        assert "sampling" in result.content[0].text.lower()


async def test_resources_prompts_completion_pass_through(served: Served) -> None:
    async with connect(served.url, "legacy") as client:
        uris = [r.uri for r in (await client.list_resources()).resources]
        assert "test://static-text" in uris
        read = await client.read_resource("test://template/7/data")
        assert "Data for ID: 7" in read.contents[0].text
        prompt = await client.get_prompt("test_prompt_with_arguments", {"arg1": "a", "arg2": "b"})
        assert "arg1='a'" in prompt.messages[0].content.text
        done = await client.complete(types.PromptReference(name="test_prompt_with_arguments"),
                                     {"name": "arg1", "value": "par"})
        assert "paris" in done.completion.values


async def test_token_and_host_checks(served: Served) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    headers = {"Accept": "application/json, text/event-stream"}
    async with httpx.AsyncClient() as http:
        missing = await http.post(served.url, json=body, headers=headers)
        assert missing.status_code == 401
        auth = {**headers, "Authorization": f"Bearer {TOKEN}"}
        evil = await http.post(served.url, json=body, headers={**auth, "Host": "evil.example"})
        assert evil.status_code == 403
        origin = await http.post(served.url, json=body,
                                 headers={**auth, "Origin": "http://evil.example"})
        assert origin.status_code == 403


async def test_unknown_method_before_initialize_is_an_error(served: Served) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "no/such/method", "params": {}}
    headers = {"Accept": "application/json, text/event-stream",
               "Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    async with httpx.AsyncClient(timeout=10) as http:
        response = await http.post(served.url, json=body, headers=headers)
    assert response.status_code in (200, 400, 404)
    assert "error" in response.text


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_list_changed_reaches_clients(served: Served, mode: str) -> None:
    changed = anyio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    async def added(args: EchoIn, ctx: object) -> ToolResponse:
        return ToolResponse(content="new")

    async with connect(served.url, mode, message_handler=on_message) as client:
        await client.list_tools()
        if mode == "legacy":
            with anyio.fail_after(5):
                served.location.tools.register(
                    {"added_tool": Tool(description="new", input=EchoIn, execute=added)})
                await changed.wait()
        else:
            async with client.listen(tools_list_changed=True) as sub:
                served.location.tools.register(
                    {"added_tool": Tool(description="new", input=EchoIn, execute=added)})
                with anyio.fail_after(5):
                    async for _event in sub:
                        break
        names = [t.name for t in (await client.list_tools()).tools]
        assert "added_tool" in names


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_list_changed_after_a_manifest_edit(served: Served, mode: str, tmp_path) -> None:
    manifests = tmp_path / "manifests"
    changed = anyio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    (manifests / "more.toml").write_text(
        '[tools.from_manifest]\nkind = "command"\ndescription = "added by editing a manifest"\n'
        'input = { type = "object", properties = {} }\nargv = ["echo", "edited"]\n'
    )
    async with connect(served.url, mode, message_handler=on_message) as client:
        assert "from_manifest" not in [t.name for t in (await client.list_tools()).tools]
        if mode == "legacy":
            assert await served.location.reload_manifests()
            with anyio.fail_after(5):
                await changed.wait()
        else:
            async with client.listen(tools_list_changed=True) as sub:
                assert await served.location.reload_manifests()
                with anyio.fail_after(5):
                    async for _event in sub:
                        break
        names = [t.name for t in (await client.list_tools()).tools]
        assert "from_manifest" in names


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_ended_sessions_are_forgotten(
    served: Served, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The facade keeps a snapshot per session only while the session lives: a daemon that
    serves one short session (in 2026-07-28, one request) after another must not hold one
    per session it ever served and refresh them all on every registry change."""
    for i in range(5):
        async with connect(served.url, mode) as client:
            await client.list_tools()
            result = await raw_call(client, "echo", {"text": f"t{i}"})
            assert result.structured_content == {"echoed": f"t{i}"}
    location = served.location
    taken: list[str | None] = []
    original = location.snapshot

    def counting(**kwargs: Any) -> Any:
        taken.append(kwargs.get("session_id"))
        return original(**kwargs)

    monkeypatch.setattr(location, "snapshot", counting)
    await anyio.sleep(0.2)  # the sessions' server tasks wind down
    location.tools.register({"later": Tool(description="Added later", input=EchoIn,
                                           execute=lambda args, ctx: ToolResponse(text="x"))})
    await anyio.sleep(0.5)  # the change is pushed after a 50 ms debounce
    assert len(taken) <= 1, taken  # at most a session still winding down


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_sessions_keep_their_snapshots_out_of_the_id_store(
    served: Served, mode: str
) -> None:
    """A session holds its own snapshot; kept by id too, every listing and every refresh of
    every session would push the `/v1` callers' snapshots out of the 1,024 the store keeps."""
    kept = len(served.location.snapshots)
    async with connect(served.url, mode) as client:
        for _ in range(3):
            await client.list_tools()
        result = await raw_call(client, "echo", {"text": "hi"})
        assert result.structured_content == {"echoed": "hi"}
        assert len(served.location.snapshots) == kept
