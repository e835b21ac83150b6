"""Seam rules seen through /mcp with the Python `mcp` client and published servers: a call id
answers only its own call; results stay bounded; links in results can be followed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sidecar import Tool, ToolResponse
from sidecar.serve.mcp_facade import CALL_ID_KEY
from tests.facade.conftest import EchoIn, serving
from tests.facade.test_http import connect, raw_call

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parents[2]
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
