"""A call id whose outcome was pruned after the retention period, replayed through /mcp: an
`expired` error result, and the tool does not run again."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from sidecar import Tool, ToolResponse
from sidecar.serve.mcp_facade import CALL_ID_KEY
from tests.serve.mcp_facade.conftest import EchoIn, serving
from tests.serve.mcp_facade.test_http import connect, raw_call

pytestmark = pytest.mark.anyio


async def test_a_pruned_call_id_replays_as_expired_through_mcp(tmp_path: Path) -> None:
    runs: list[str] = []

    async def count(args: EchoIn, ctx: object) -> ToolResponse:
        runs.append(args.text)
        return ToolResponse(content=f"ran {args.text}")

    async with serving(tmp_path, {}) as served:
        served.location.tools.register(
            {"count": Tool(description="Count runs", input=EchoIn, execute=count)})
        async with connect(served.url, "legacy") as client:
            await client.list_tools()
            first = await raw_call(client, "count", {"text": "x"}, {CALL_ID_KEY: "exp-1"})
            assert not first.is_error and first.content[0].text == "ran x"
            outcomes = served.location.seam.outcomes
            assert outcomes is not None
            assert await outcomes.prune(time.time() + 1) == 1
            again = await raw_call(client, "count", {"text": "x"}, {CALL_ID_KEY: "exp-1"})
            assert again.is_error
            assert again.meta["sidecar/error"]["kind"] == "expired"
            text = again.content[0].text
            assert "'exp-1'" in text and "pruned after the retention period" in text
            assert "not run again" in text
            fresh = await raw_call(client, "count", {"text": "x"}, {CALL_ID_KEY: "exp-2"})
            assert not fresh.is_error
    assert runs == ["x", "x"]  # the first call and the new id; never the expired one
