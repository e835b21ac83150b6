"""`sidecar stdio` as an agent launches it: the Python MCP client over real pipes, both eras."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters, types

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_sidecar_stdio_lists_and_calls_tools(tmp_path, mode):
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "sidecar.cli", "stdio"], cwd=str(ROOT),
        env={"SIDECAR_STATE_DIR": str(tmp_path / "state"),
             "SIDECAR_MANIFESTS": str(ROOT / "manifests")},
    )
    async with Client(params, mode=mode, cache=None, read_timeout_seconds=60) as client:
        names = [t.name for t in (await client.list_tools()).tools]
        assert "utc_now" in names and "managed_read" in names
        result = await client.session.send_request(
            types.CallToolRequest(params=types.CallToolRequestParams(name="utc_now",
                                                                     arguments={})),
            types.CallToolResult,
        )
        assert not result.is_error
        assert result.content[0].text.startswith("20")
        bad = await client.session.send_request(
            types.CallToolRequest(params=types.CallToolRequestParams(
                name="managed_read", arguments={"ref": 5})),
            types.CallToolResult,
        )
        assert bad.is_error and "$.ref" in bad.content[0].text
