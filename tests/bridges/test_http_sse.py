"""Streamable HTTP and SSE servers (uvicorn on 127.0.0.1, real processes): calls, progress,
timeouts and cancellation forwarded upstream, results past the SDK's 1 MiB event cap, and a
clear error past max_result_bytes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import anyio
import anyio.to_thread
import pytest

from bridges.manifest.loading import ServerConfig
from bridges.mcp import ServerPool
from sidecar import Location, TextContent
from sidecar.model.errors import ErrorKind
from sidecar.model.events import CallProgress
from tests.bridges.helpers import HttpServers, ctx, eventually, read_events

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("transport", ["http", "sse"])
async def test_calls_over_http_transports(
    location: Location, http_servers: HttpServers, events: Path, transport: str
) -> None:
    url, _ = await http_servers.launch_testserver(transport, "--events", str(events))
    config = ServerConfig(url=url, type=transport, headers={"X-Test": "present"})
    # the same server with a short call timeout, for the call that must time out (the other
    # calls keep the default: a 3 MB result may take over 0.5 s on a loaded machine)
    bounded = ServerConfig(url=url, type=transport, timeouts={"call": 0.5},
                           headers={"X-Test": "present"})
    async with (
        ServerPool({"h": config, "t": bounded}, location.tools) as pool,
        location.events.subscribe() as subscription,
    ):
        assert pool.health()["h"].state == "ready"
        assert pool.health()["h"].transport == transport
        snapshot = location.snapshot()

        echo = await snapshot.execute("h_echo", {"text": "over " + transport}, ctx())
        assert echo.content == (TextContent("over " + transport),)
        add = await snapshot.execute("h_add", {"a": 1, "b": 2}, ctx())
        assert add.output == {"sum": 3}

        progress = await snapshot.execute("h_progress", {"steps": 2}, ctx())
        assert progress.status == "completed"
        seen = []
        while not subscription.queue.empty():
            event = subscription.queue.get_nowait()
            if isinstance(event, CallProgress) and "progress" in event.snapshot:
                seen.append(event.snapshot["progress"])
        assert seen and seen[-1] == 2

        # 3 MB: past the SDK's default 1 MiB event cap, within our max_result_bytes
        big = await snapshot.execute("h_big", {"bytes": 3_000_000}, ctx())
        assert big.status == "completed", big.error
        assert big.managed and big.managed[0].size_bytes == 3_000_000

        timed_out = await snapshot.execute("t_slow", {"seconds": 20, "tag": "timeout"}, ctx())
        assert timed_out.error is not None and timed_out.error.kind is ErrorKind.TIMEOUT
        assert "timeouts.call" in timed_out.error.message
        await eventually(lambda: read_events(events, "cancelled"), what="upstream cancel")

        task = asyncio.ensure_future(snapshot.execute(
            "h_slow", {"seconds": 20, "tag": "ours"}, ctx()
        ))
        await eventually(lambda: len(read_events(events, "slow-start")) == 2, what="the call")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        cancelled = await eventually(
            lambda: [e for e in read_events(events, "cancelled") if e["tag"] == "ours"],
            what="upstream cancel of our call",
        )
        assert cancelled

        still = await snapshot.execute("h_echo", {"text": "still"}, ctx())
        assert still.content == (TextContent("still"),)
        assert pool.health()["h"].restarts == pool.health()["t"].restarts == 0


async def test_past_max_result_bytes_over_http_is_a_clear_upstream_error(
    location: Location, http_servers: HttpServers
) -> None:
    url, _ = await http_servers.launch_testserver("http")
    config = ServerConfig(url=url, max_result_bytes=1_000_000)
    async with ServerPool({"h": config}, location.tools) as pool:
        snapshot = location.snapshot()
        too_big = await snapshot.execute("h_big", {"bytes": 2_000_000}, ctx())
        assert too_big.error is not None and too_big.error.kind is ErrorKind.UPSTREAM
        assert "max_result_bytes" in too_big.error.message
        assert "'h'" in too_big.error.message and "'big'" in too_big.error.message
        fine = await snapshot.execute("h_echo", {"text": "ok"}, ctx())
        assert fine.content == (TextContent("ok"),)
        assert pool.health()["h"].restarts == 0


async def test_a_dead_http_server_fails_calls_upstream_and_is_retried(
    location: Location, http_servers: HttpServers
) -> None:
    url, proc = await http_servers.launch_testserver("http")
    async with ServerPool({"h": ServerConfig(url=url)}, location.tools) as pool:
        proc.kill()
        await anyio.to_thread.run_sync(proc.wait)
        outcome = await location.snapshot().execute("h_echo", {"text": "anyone?"}, ctx())
        assert outcome.error is not None and outcome.error.kind is ErrorKind.UPSTREAM
        assert "'h'" in outcome.error.message and "'echo'" in outcome.error.message
        health = await eventually(
            lambda: (h := pool.health()["h"]).state == "backoff" and h,
            what="backoff after the server died",
        )
        assert health.last_error
