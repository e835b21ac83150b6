"""`bridges.mcp.http_parse`: a large message from an HTTP upstream is parsed in a worker
thread in bounded steps, so the event loop keeps running while it is parsed."""

from __future__ import annotations

import asyncio
import json

import pytest
from mcp_types import JSONRPCResponse

from bridges.mcp.http_parse import parse_off_loop

pytestmark = pytest.mark.anyio


def _listing(tools: int) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": 7, "result": {"tools": [
        {"name": f"t{i}", "description": "d" * 200,
         "inputSchema": {"type": "object", "properties": {f"p{j}": {"type": "string"}
                                                          for j in range(20)}}}
        for i in range(tools)]}}).encode()


async def test_the_loop_runs_while_a_large_message_is_parsed() -> None:
    body = _listing(8000)  # about 8 MB
    assert len(body) > 5_000_000
    turns = 0
    parsing = True

    async def tick() -> None:
        nonlocal turns
        while parsing:
            turns += 1
            await asyncio.sleep(0)

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0)
    before = turns
    message = await parse_off_loop(body)
    parsing = False
    await ticker
    assert isinstance(message, JSONRPCResponse) and message.id == 7
    assert len(message.result["tools"]) == 8000
    assert turns - before > 10  # the loop went on turning while the worker parsed


async def test_a_bad_message_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        await parse_off_loop(b'{"jsonrpc": "2.0", "id": 1, "result": {' + b"x" * 300_000)
    with pytest.raises(ValueError):
        await parse_off_loop(b'{"not": "json-rpc"}')
