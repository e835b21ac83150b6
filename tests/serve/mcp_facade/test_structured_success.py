"""A successful call stays a success for MCP clients: an over-bound result of a tool that
declares an output schema, through a real `sidecar serve` (/mcp) and a real `sidecar stdio`,
to the Python `mcp` client, which checks every success against the advertised `outputSchema`."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx2
import jsonschema
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from tests.hardening.daemon_process import serving, sidecar_env

pytestmark = pytest.mark.anyio
REPO = Path(__file__).resolve().parents[3]
TESTSERVER = REPO / "tests/bridges/servers/testserver.py"
BOUND = 50 * 1024
BIG = 2_000_000


def manifests(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    server = {"command": sys.executable, "args": [str(TESTSERVER)], "namespace": "t",
              "protocol": "legacy"}
    (directory / "servers.json").write_text(json.dumps({"mcpServers": {"t": server}}))
    return directory


@asynccontextmanager
async def over_http(url: str, token: str, mode: str) -> AsyncIterator[Client]:
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                                  timeout=httpx2.Timeout(60)) as http, \
            Client(streamable_http_client(f"{url}/mcp", http_client=http), mode=mode,
                   cache=None) as client:
        yield client


def model_visible_bytes(result: types.CallToolResult) -> int:
    text = sum(len(item.text.encode()) for item in result.content
               if isinstance(item, types.TextContent))
    structured = result.structured_content
    return text + (len(json.dumps(structured).encode()) if structured is not None else 0)


async def listed_once_started(client: Client) -> dict[str, types.Tool]:
    """`tools/list` once the upstream is listed (a daemon lists servers still starting in
    `_meta`, and adds their tools when they are ready)."""
    with anyio.fail_after(60):
        while True:
            listing = await client.list_tools()
            if "t_big_structured" in {t.name for t in listing.tools}:
                return {t.name: t for t in listing.tools}
            await anyio.sleep(0.1)


async def succeeds_bounded(client: Client) -> None:
    """What an agent sees for `t_big_structured`: the schema where checkers do not look, an
    over-bound result as a success with a preview and a ref, a small one whole and valid."""
    listed = await listed_once_started(client)
    schema = listed["t_big_structured"].meta["sidecar/outputSchema"]
    assert listed["t_big_structured"].output_schema is None
    # Client.call_tool validates every success against the listed outputSchema (it raises
    # RuntimeError on a success without structuredContent for a tool that advertises one)
    big = await client.call_tool("t_big_structured", {"bytes": BIG})
    assert not big.is_error, big.content
    assert big.structured_content is None
    assert model_visible_bytes(big) <= BOUND
    preview, note = big.content[0].text, big.content[-1].text
    assert preview.startswith("xxxxxxxx")
    ref = big.meta["sidecar/structured"]["ref"]
    assert note.startswith("[The call succeeded.") and ref in note
    assert big.meta["sidecar/structured"]["bytes"] > BIG
    head = await client.call_tool("managed_read", {"ref": ref, "offset": 1, "start": 0,
                                                   "length": 20})
    assert not head.is_error and head.content[0].text.endswith('{"content":"xxxxxxxx')

    small = await client.call_tool("t_big_structured", {"bytes": 500})
    assert not small.is_error and small.structured_content is not None
    jsonschema.validate(small.structured_content, schema)


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_over_bound_structured_result_is_a_success_over_sidecar_serve(
    tmp_path: Path, mode: str,
) -> None:
    state = tmp_path / "state"
    with serving(state, manifests=manifests(tmp_path / "manifests")) as daemon:
        async with over_http(daemon.url, daemon.token, mode) as client:
            await succeeds_bounded(client)


async def test_over_bound_structured_result_is_a_success_over_sidecar_stdio(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    params = StdioServerParameters(
        command=sys.executable, cwd=str(REPO),
        args=["-m", "sidecar.cli", "stdio", "--standalone"],
        env=sidecar_env(state, manifests(tmp_path / "manifests")),
    )
    async with Client(params, mode="legacy", cache=None, read_timeout_seconds=60) as client:
        await succeeds_bounded(client)

