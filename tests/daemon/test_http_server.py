"""`HttpServer`: an idle server wakes once a tick (uvicorn's own loop: ten times a second) and
stops at once when `should_exit` is set, not at its next tick. A real uvicorn server on
127.0.0.1."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
import uvicorn

from sidecar.daemon.http_server import HttpServer

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, bool]]:
    return ("asyncio", {"use_uvloop": True})  # as the daemon runs


async def _hello(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"hello"})


class _Counted(HttpServer):
    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ticks: list[int] = []

    async def on_tick(self, counter: int) -> bool:
        self.ticks.append(counter)
        return await super().on_tick(counter)


async def test_an_idle_server_ticks_once_a_second_and_stops_when_asked() -> None:
    config = uvicorn.Config(_hello, host="127.0.0.1", port=0, lifespan="off",
                            log_level="warning")
    server = _Counted(config)
    serving = asyncio.create_task(server.serve())
    for _ in range(3000):
        if server.started:
            break
        await asyncio.sleep(0.01)
    assert server.started, "the server did not start in 30 s"
    port = server.servers[0].sockets[0].getsockname()[1]
    async with httpx.AsyncClient() as client:
        answer = await client.get(f"http://127.0.0.1:{port}/")
    assert answer.text == "hello" and "date" in answer.headers
    await asyncio.sleep(2.5)
    assert 2 <= len(server.ticks) <= 4, server.ticks  # uvicorn's own loop: ~25 by now
    assert all(counter % 10 == 0 for counter in server.ticks)  # each refreshes the date

    server.tick_seconds = 60.0  # from the next wait on: only the exit event can end it
    await asyncio.sleep(1.2)
    started = time.monotonic()
    server.should_exit = True
    await asyncio.wait_for(serving, 30)
    assert time.monotonic() - started < 10  # not the 60 s tick
