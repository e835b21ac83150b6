"""An upstream pinned to `protocol = "2026-07-28"` is asked `server/discover` once connected
(the SDK would adopt an empty capability set for it), so its resources and prompts are listed
through the facade as with `protocol = "auto"`."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.serve.mcp_facade.conftest import fixture_server, serving
from tests.serve.mcp_facade.test_http import connect

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("protocol", ["2026-07-28", "auto"])
async def test_a_pinned_2026_upstream_lists_its_resources_and_prompts(
    tmp_path: Path, protocol: str
) -> None:
    servers = {"fixture": fixture_server(protocol=protocol)}
    async with serving(tmp_path, servers) as served, connect(served.url, "legacy") as client:
        tools = await client.list_tools()
        assert any(tool.name == "test_simple_text" for tool in tools.tools)
        resources = await client.list_resources()
        prompts = await client.list_prompts()
        assert "test://static-text" in [str(r.uri) for r in resources.resources]
        assert "test_simple_prompt" in [p.name for p in prompts.prompts]
        read = await client.read_resource("test://static-text")
        assert read.contents[0].text  # type: ignore[union-attr]
