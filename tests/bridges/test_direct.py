"""Tool calls written on the stdio pipe directly (`bridges.mcp.stdio.DirectRequests`), against
a bare JSON-RPC server that sends what a slow or misbehaving server sends; and the SDK test
server, to show that real stdio connections (both protocol eras) take this way."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage

from bridges.mcp.call_results import PlainResult
from bridges.mcp.connection import Era, open_connection
from bridges.mcp.redact import Redactor
from bridges.mcp.stdio import DirectRequests, LogFn, StderrTail, stdio_transport
from bridges.mcp.transport_state import TransportState
from bridges.prestart import StdioSpec
from tests.bridges.helpers import SERVERS, eventually, stdio

pytestmark = pytest.mark.anyio

RAW_SERVER = SERVERS / "raw_server.py"


class Raw:
    def __init__(self, direct: DirectRequests, tail: StderrTail) -> None:
        self.direct = direct
        self.tail = tail
        self.others: list[SessionMessage | Exception] = []  # what the SDK session would get

    async def call(self, name: str, *, wait: float = 5.0, progress: Any = None) -> Any:
        return await self.direct.request(
            "tools/call", {"name": name, "arguments": {"n": 1}},
            read_timeout=wait, on_progress=progress,
        )

    def notifications(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.tail.text().splitlines() if line.strip()]


@asynccontextmanager
async def raw_server(on_log: LogFn | None = None) -> AsyncIterator[Raw]:
    spec = StdioSpec(command=sys.executable, args=(str(RAW_SERVER),), env={}, cwd=None,
                     max_message_bytes=1 << 20)
    direct = DirectRequests(on_log)
    raw = Raw(direct, StderrTail("raw", Redactor()))
    async with stdio_transport(spec, server="raw", stderr=raw.tail, info=TransportState(),
                               direct=direct) as (read, _write):
        async with anyio.create_task_group() as tg:
            async def collect() -> None:
                async for item in read:
                    raw.others.append(item)

            tg.start_soon(collect)
            yield raw
            tg.cancel_scope.cancel()


async def test_results_errors_and_malformed_answers() -> None:
    async with raw_server() as raw:
        result = await raw.call("echo")
        assert result == {"content": [{"type": "text", "text": '{"n": 1}'}]}
        with pytest.raises(MCPError) as error:
            await raw.call("error")
        assert (error.value.code, error.value.message) == (-32000, "nope")
        with pytest.raises(MCPError, match="malformed response") as malformed:
            await raw.call("malformed")
        assert malformed.value.code == types.INTERNAL_ERROR
        assert raw.others == []  # nothing of ours reached the SDK's stream


async def test_progress_reaches_only_its_call_and_strangers_go_to_the_session() -> None:
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        await anyio.sleep(0.05)  # a slow relay: the answer still waits for it
        seen.append((progress, total, message))

    async with raw_server() as raw:
        await raw.call("progress", progress=on_progress)
        assert seen == [(1.0, 2.0, "step 1"), (2.0, 2.0, "step 2")]
        await raw.call("stranger", progress=on_progress)
        await eventually(lambda: len(raw.others) == 2, what="the strangers' progress")
        assert len(seen) == 2
        assert all(isinstance(m, SessionMessage) for m in raw.others)


async def test_logs_before_an_answer_are_handled_before_the_call_returns() -> None:
    """A log relayed after its call ended would reach no client (it follows the call): the
    answer waits for the log lines read before it, however slow their relay, in order."""
    seen: list[Any] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        await anyio.sleep(0.1 if params.data == "log 1" else 0)
        seen.append(params.data)

    async with raw_server(on_log) as raw:
        result = await raw.call("logs")
        assert seen == ["log 1", "log 2"]
        assert result["content"][0]["type"] == "text"
        assert raw.others == []  # the log lines did not also reach the SDK's stream


async def test_a_timeout_sends_a_courtesy_cancel_and_the_late_answer_is_dropped() -> None:
    async with raw_server() as raw:
        with pytest.raises(MCPError) as timed_out:
            await raw.call("late", wait=0.1)
        assert timed_out.value.code == types.REQUEST_TIMEOUT
        await eventually(lambda: raw.notifications(), what="the cancel notification")
        (cancel,) = raw.notifications()
        assert cancel["method"] == "notifications/cancelled"
        assert cancel["params"]["requestId"].startswith("mcp-sidecar/")
        assert "timed out" in cancel["params"]["reason"]
        await anyio.sleep(0.6)  # the late answer arrives now and is dropped
        assert (await raw.call("echo"))["content"][0]["type"] == "text"
        assert raw.others == []


async def test_our_cancellation_is_forwarded_and_propagates() -> None:
    async with raw_server() as raw:
        with anyio.move_on_after(0.1) as scope:
            await raw.call("late")
        assert scope.cancelled_caught
        await eventually(lambda: raw.notifications(), what="the cancel notification")
        assert raw.notifications()[0]["params"]["reason"] == "caller cancelled"


async def test_a_server_that_dies_fails_the_call_and_every_later_one() -> None:
    async with raw_server() as raw:
        with pytest.raises(MCPError) as lost:
            await raw.call("die")
        assert lost.value.code == types.CONNECTION_CLOSED
        with pytest.raises(MCPError) as later:
            await raw.call("echo")
        assert later.value.code == types.CONNECTION_CLOSED


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_stdio_connections_call_directly_with_the_eras_stamp(mode: str, tmp_path) -> None:
    """The SDK test server over stdio, in each era: calls go the direct way, carry the
    session's `_meta` stamp and map as before (a 2026-07-28 server refuses a call without the
    stamp's protocol version and client info: "Invalid request parameters")."""
    events = tmp_path / "events.jsonl"
    config = stdio(events=events)

    async def ignore(*_: Any) -> None:
        return None

    async with open_connection(
        "t", config, era=Era(mode), on_message=ignore, on_log=ignore,
        stderr=StderrTail("t", Redactor()), state=TransportState(),
    ) as connection:
        assert connection.direct
        assert connection.pipe_stamped  # the stamp's `_meta` taken once, without its headers
        assert connection.protocol_version == (mode if mode != "legacy" else "2025-11-25")
        result = await connection.call("echo", {"text": "hi"}, call_timeout=5, progress=None)
        assert isinstance(result, PlainResult)  # text alone: read without a model
        assert (result.texts, result.is_error) == (["hi"], False)
