"""Rate limits on a real MCP test server: refused with `unavailable` and when to retry, then
recovered; counted in /metrics. The bucket's clock is the test's, so nothing waits on time."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
import httpx
import pytest

from sidecar import Location, ToolContext
from sidecar.serve.app import build_app
from tests.bridges.helpers import TESTSERVER
from tests.live_server import live_server

pytestmark = pytest.mark.anyio
TOKEN = "rate-token-0123456789-abcdefghijklmnopqrstuvwxyz"

LIMITS = """
[rate_limits."alpha_echo"]
calls_per_minute = 2

[rate_limits."alpha_slow"]
concurrency = 1

[profiles.tight]
servers = ["alpha"]
[profiles.tight.rate_limit]
calls_per_minute = 1
"""


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def ctx(call_id: str) -> ToolContext:
    return ToolContext("s", "a", "m", call_id)


async def opened(tmp_path: Path) -> tuple[Path, Path]:
    directory = tmp_path / "m"
    directory.mkdir()
    servers = {"alpha": {"command": sys.executable, "args": [str(TESTSERVER)]}}
    (directory / "servers.json").write_text(json.dumps({"mcpServers": servers}))
    (directory / "limits.toml").write_text(LIMITS)
    return directory, tmp_path / "state"


async def ready(location: Location) -> None:
    with anyio.fail_after(30):
        while "alpha_echo" not in location.registry.effective():  # noqa: ASYNC110
            await anyio.sleep(0.05)


async def test_calls_per_minute_reject_then_recover(tmp_path: Path) -> None:
    directory, state = await opened(tmp_path)
    async with Location.open(tmp_path, state_dir=state, manifests=[directory]) as loc:
        await ready(loc)
        clock = loc.rate_limits.clock = Clock()
        snap = loc.snapshot()
        for i in range(2):
            ok = await snap.execute("alpha_echo", {"text": f"t{i}"}, ctx(f"r{i}"))
            assert ok.status == "completed", ok
        refused = await snap.execute("alpha_echo", {"text": "t2"}, ctx("r2"))
        assert refused.error is not None and refused.error.kind == "unavailable"
        assert refused.error.message == (
            "Rate limit: tool alpha_echo allows 2 calls per minute; retry in 30 s.")
        other = await snap.execute("alpha_add", {"a": 1, "b": 1}, ctx("r3"))
        assert other.status == "completed"  # the limit is per tool
        clock.now += 30  # one call's worth refilled
        again = await snap.execute("alpha_echo", {"text": "t4"}, ctx("r4"))
        assert again.status == "completed" and again.content[0].text == "t4"
        app = build_app(loc, token=TOKEN)
        async with live_server(app) as port, httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", headers={"authorization": f"Bearer {TOKEN}"},
            timeout=30,
        ) as http:
            metrics = (await http.get("/metrics")).text
        assert 'sidecar_rate_limited_total{limit="tool:alpha_echo"} 1.0' in metrics
        assert (await loc.health())["rate_limited"] == {"tool:alpha_echo": 1}


async def test_concurrency_and_profile_limits(tmp_path: Path) -> None:
    directory, state = await opened(tmp_path)
    async with Location.open(tmp_path, state_dir=state, manifests=[directory]) as loc:
        await ready(loc)
        clock = loc.rate_limits.clock = Clock()
        snap = loc.snapshot()
        async def slow() -> None:
            await snap.execute("alpha_slow", {"seconds": 30}, ctx("c1"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(slow)  # one slow call holds the only slot
            with anyio.fail_after(30):
                while not any(lim.running for lim in loc.rate_limits._limiters.values()):  # noqa: ASYNC110
                    await anyio.sleep(0.02)
            busy = await snap.execute("alpha_slow", {"seconds": 0}, ctx("c2"))
            assert busy.error is not None and busy.error.kind == "unavailable"
            assert busy.error.message == ("Rate limit: tool alpha_slow has 1 call(s) running, "
                                          "at most 1 at once; retry when one has finished.")
            tg.cancel_scope.cancel()  # the slow call ends (cancelled): the slot is free
        recovered = await snap.execute("alpha_slow", {"seconds": 0}, ctx("c3"))
        assert recovered.status == "completed", recovered
        # the profile's own limit: one call per minute through `tight`, whatever the tool
        tight = loc.snapshot(profile="tight")
        assert (await tight.execute("alpha_add", {"a": 1, "b": 2}, ctx("p1"))).status == (
            "completed")
        limited = await tight.execute("alpha_add", {"a": 1, "b": 2}, ctx("p2"))
        assert limited.error is not None and limited.error.kind == "unavailable"
        assert limited.error.message == (
            "Rate limit: profile tight allows 1 calls per minute; retry in 60 s.")
        outside = await loc.snapshot().execute("alpha_add", {"a": 1, "b": 2}, ctx("p3"))
        assert outside.status == "completed"  # the default view is not limited by `tight`
        clock.now += 60
        assert (await tight.execute("alpha_add", {"a": 2, "b": 2}, ctx("p4"))).status == (
            "completed")
