"""Seam rules seen through /mcp with the Python `mcp` client and published servers: a call id
answers only its own call; results stay bounded; links in results can be followed."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest

from sidecar import Tool, ToolContext, ToolResponse
from sidecar.serve.mcp_facade import CALL_ID_KEY
from tests.serve.mcp_facade.conftest import EchoIn, serving
from tests.serve.mcp_facade.test_http import connect, raw_call

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parents[3]
EVERYTHING = REPO / ".deps/npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js"


def everything(namespace: str = "ev") -> dict[str, Any]:
    return {"command": "node", "args": [str(EVERYTHING), "stdio"], "namespace": namespace}


async def test_a_used_call_id_answers_only_its_own_call(tmp_path: Path) -> None:
    runs: list[str] = []

    async def count(args: EchoIn, ctx: object) -> ToolResponse:
        runs.append(args.text)
        return ToolResponse(content=f"ran {args.text}")

    async with serving(tmp_path, {"ev": everything()}) as served:
        served.location.tools.register(
            {"count": Tool(description="Count runs", input=EchoIn, execute=count)})
        async with connect(served.url, "legacy") as client:
            await client.list_tools()
            first = await raw_call(client, "ev_echo", {"message": "a"}, {CALL_ID_KEY: "dup-1"})
            assert first.content[0].text == "Echo: a"
            again = await raw_call(client, "ev_echo", {"message": "a"}, {CALL_ID_KEY: "dup-1"})
            assert not again.is_error and again.content[0].text == "Echo: a"  # a replay
            other_input = await raw_call(client, "ev_echo", {"message": "b"},
                                         {CALL_ID_KEY: "dup-1"})
            assert other_input.is_error
            assert other_input.meta["sidecar/error"]["kind"] == "conflict"
            assert "'dup-1'" in other_input.content[0].text
            assert "not run" in other_input.content[0].text

            assert not (await raw_call(client, "count", {"text": "x"}, {CALL_ID_KEY: "c-2"})
                        ).is_error
            other_tool = await raw_call(client, "ev_echo", {"message": "x"}, {CALL_ID_KEY: "c-2"})
            assert other_tool.is_error and "'c-2'" in other_tool.content[0].text
            same_id_other_text = await raw_call(client, "count", {"text": "y"},
                                                {CALL_ID_KEY: "c-2"})
            assert same_id_other_text.is_error
        async with connect(served.url, "legacy") as other_session:
            await other_session.list_tools()
            # the same call from another session is another call
            elsewhere = await raw_call(other_session, "count", {"text": "x"},
                                       {CALL_ID_KEY: "c-2"})
            assert elsewhere.is_error and "conflict" == elsewhere.meta["sidecar/error"]["kind"]
        assert runs == ["x"]  # nothing ran under a used id
        stored = await served.location.outcome("dup-1")
        assert stored is not None and stored.content[0].text == "Echo: a"  # type: ignore[union-attr]


TESTSERVER = REPO / "tests/bridges/servers/testserver.py"
BOUND = 50 * 1024


def sdk_server(namespace: str, **fields: Any) -> dict[str, Any]:
    return {"command": sys.executable, "args": [str(TESTSERVER)], "namespace": namespace,
            "protocol": "legacy", **fields}


def visible_bytes(result: types.CallToolResult) -> int:
    """What a model may be shown: text, embedded text, links, structuredContent."""
    size = 0
    for item in result.content:
        if isinstance(item, types.TextContent):
            size += len(item.text.encode())
        elif isinstance(item, types.EmbeddedResource) and hasattr(item.resource, "text"):
            size += len(item.resource.text.encode())
        elif isinstance(item, types.ResourceLink):
            size += len(item.model_dump_json().encode())
    if result.structured_content is not None:
        size += len(json.dumps(result.structured_content).encode())
    return size


async def test_structured_content_is_bounded_and_stays_valid_for_checking_clients(
    tmp_path: Path,
) -> None:
    servers = {"t": sdk_server("t"), "full": sdk_server("full", structured_output="full"),
               "off": sdk_server("off", structured_output="off")}
    async with serving(tmp_path, servers) as served, \
            connect(served.url, "legacy") as client:
        listed = {t.name: t for t in (await client.list_tools()).tools}
        # bounded: the schema is in _meta, so a success without structuredContent is valid
        assert listed["t_big_structured"].output_schema is None
        assert listed["t_big_structured"].meta["sidecar/outputSchema"]["required"] == ["content"]
        assert listed["full_big_structured"].output_schema is not None
        assert listed["off_big_structured"].output_schema is None  # nothing to expect
        assert "sidecar/outputSchema" not in (listed["off_big_structured"].meta or {})
        big = await client.call_tool("t_big_structured", {"bytes": 5_000_000})
        assert big.structured_content is None and not big.is_error
        assert visible_bytes(big) <= BOUND
        note = big.content[-1].text
        assert note.startswith("[The call succeeded.")
        ref = big.meta["sidecar/structured"]["ref"]
        assert f'managed_read(ref="{ref}", offset=1, start=0)' in note
        head = await client.call_tool("managed_read", {"ref": ref, "offset": 1, "start": 0,
                                                       "length": 20})
        assert head.content[0].text.split("\n", 1)[1] == '{"content":"xxxxxxxx'
        assert big.meta["sidecar/structured"]["bytes"] > 5_000_000

        small = await client.call_tool("t_big_structured", {"bytes": 1000})
        assert not small.is_error and small.structured_content == {"content": ANY_TEXT}
        assert visible_bytes(small) <= BOUND

        full = await client.call_tool("full_big_structured", {"bytes": 200_000})
        assert not full.is_error and len(full.structured_content["content"]) == 200_000
        off = await client.call_tool("off_big_structured", {"bytes": 200_000})
        assert not off.is_error and off.structured_content is None
        assert visible_bytes(off) <= BOUND

        # Code Mode and /v1 are programmatic: the full output stays theirs
        direct = await served.location.snapshot().execute(
            "t_big_structured", {"bytes": 300_000}, ToolContext("s", "a", "m", "v1-1"))
        assert len(direct.output["content"]) == 300_000


async def test_embedded_resources_and_links_count_as_model_visible_text(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path, {"t": sdk_server("t")}) as served, \
            connect(served.url, "legacy") as client:
        await client.list_tools()
        resource = await client.call_tool("t_big_resource", {"bytes": 5_000_000})
        assert not resource.is_error and visible_bytes(resource) <= BOUND
        (managed,) = resource.meta["sidecar/managed"]
        assert managed["size_bytes"] > 5_000_000
        text = resource.content[0].text
        assert text.startswith("the file:\n[resource: test://big.txt, text/plain]\nxxx")
        found = await client.call_tool("managed_read", {"ref": managed["ref"],
                                                        "pattern": "^\\[resource: test"})
        assert "matching line" in found.content[0].text

        links = await client.call_tool("t_many_links", {"count": 20_000})
        assert not links.is_error and visible_bytes(links) <= BOUND
        assert "[resource link: " in links.content[0].text
        few = await client.call_tool("t_many_links", {"count": 3})
        assert [type(c) for c in few.content] == [types.ResourceLink] * 3  # kept as they are


class _AnyText:
    def __eq__(self, other: object) -> bool:
        return isinstance(other, str)


ANY_TEXT = _AnyText()


async def test_resource_links_and_embedded_resources_of_tool_results_can_be_read(
    tmp_path: Path,
) -> None:
    # Two servers: URIs are namespaced (`ev+...`), as in resources/list
    servers = {"ev": everything("ev"), "t": sdk_server("t")}
    async with serving(tmp_path, servers) as served, \
            connect(served.url, "legacy") as client:
        await client.list_tools()
        listed = (await client.list_resources()).resources
        assert any(r.uri.startswith("ev+demo://") for r in listed)
        links = await client.call_tool("ev_get-resource-links", {"count": 2})
        found = [c for c in links.content if isinstance(c, types.ResourceLink)]
        assert len(found) == 2 and all(link.uri.startswith("ev+demo://") for link in found)
        for link in found:
            read = await client.read_resource(link.uri)
            assert read.contents and read.contents[0].uri == link.uri
        reference = await client.call_tool(
            "ev_get-resource-reference", {"resourceType": "Text", "resourceId": 2})
        (embedded,) = [c for c in reference.content if isinstance(c, types.EmbeddedResource)]
        assert embedded.resource.uri.startswith("ev+demo://")
        again = await client.read_resource(embedded.resource.uri)
        # server-everything stamps each read with the time of day: a second may pass between
        assert _untimed(again.contents[0].text) == _untimed(  # type: ignore[union-attr]
            embedded.resource.text)  # type: ignore[union-attr]


def _untimed(text: str) -> str:
    """`text` with its time of day (`9:33:24 AM`) masked."""
    return re.sub(r"\b\d{1,2}:\d{2}:\d{2}\s?[AP]M\b", "<time>", text)
