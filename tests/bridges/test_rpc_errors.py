"""JSON-RPC error responses are errors of their call, not transport losses; answers that are
valid JSON but not valid results fail their call at once, never at the call timeout."""

from __future__ import annotations

import sys

import anyio
import pytest

from bridges.manifest.loading import ServerConfig
from bridges.mcp import ServerPool
from sidecar import Location
from sidecar.model.errors import ErrorKind
from tests.bridges.helpers import SERVERS, SharedServer, ctx

pytestmark = pytest.mark.anyio

RAW = SERVERS / "raw_server.py"


def raw(*args: str) -> ServerConfig:
    return ServerConfig(command=sys.executable, args=[str(RAW), *args], protocol="legacy",
                        timeouts={"call": 60})


async def test_error_responses_fail_their_call_and_nothing_else(location: Location) -> None:
    async with ServerPool({"r": raw()}, location.tools) as pool:
        health = pool.health()["r"]
        assert health.state == "ready", health.last_error
        pid = health.pid
        snapshot = location.snapshot()
        held: list[object] = []
        async with anyio.create_task_group() as tg:
            async def hold() -> None:
                held.append(await snapshot.execute("r_hold", {}, ctx()))

            tg.start_soon(hold)
            await anyio.sleep(0.2)  # the hold call is in flight on the server
            with anyio.fail_after(10):  # promptly, not at the 60 s call timeout
                error = await snapshot.execute("r_error", {}, ctx())
                busy = await snapshot.execute("r_error32001", {}, ctx())
                bad = await snapshot.execute("r_bad_result", {}, ctx())
                odd = await snapshot.execute("r_not_jsonrpc", {}, ctx())
                malformed = await snapshot.execute("r_malformed", {}, ctx())
            released = await snapshot.execute("r_release", {}, ctx())
        assert released.status == "completed", released.error
        (held_outcome,) = held
        assert held_outcome.status == "completed", held_outcome.error  # unaffected
        for outcome in (error, busy, bad, odd, malformed):
            assert outcome.error is not None and outcome.error.kind is ErrorKind.UPSTREAM, \
                outcome.error
            assert "restart" not in outcome.error.message and "lost" not in outcome.error.message
        assert "nope" in error.error.message and "-32000" in error.error.message
        assert "upstream is busy" in busy.error.message and "-32001" in busy.error.message
        assert "no result within" not in busy.error.message
        health = pool.health()["r"]
        assert health.state == "ready" and health.restarts == 0 and health.pid == pid


@pytest.mark.parametrize(("flag", "said"), [
    ("--bad-list", "ListToolsResult"),
    ("--odd-list", "not a valid JSON-RPC response"),
])
async def test_an_invalid_tools_list_answer_fails_the_start_promptly(
    location: Location, flag: str, said: str
) -> None:
    config = raw(flag).model_copy(update={"timeouts": raw().timeouts.model_copy(
        update={"startup": 60})})
    with anyio.fail_after(20):  # not the 60 s startup timeout
        async with ServerPool({"r": config}, location.tools) as pool:
            health = pool.health()["r"]
    assert health.state in ("backoff", "failed")
    assert health.last_error is not None and said in health.last_error, health.last_error


@pytest.mark.parametrize("code", [-32000, -32001, -32099, 7])
async def test_error_responses_over_http_are_errors_of_their_call(
    location: Location, shared_http_server: SharedServer, code: int
) -> None:
    config = ServerConfig(url=shared_http_server.url, timeouts={"call": 60})
    async with ServerPool({"h": config}, location.tools) as pool:
        assert pool.health()["h"].state == "ready", pool.health()["h"].last_error
        snapshot = location.snapshot()
        with anyio.fail_after(10):
            failed = await snapshot.execute("h_rpc_error", {"code": code}, ctx())
            after = await snapshot.execute("h_echo", {"text": "still here"}, ctx())
        health = pool.health()["h"]
    assert failed.error is not None and failed.error.kind is ErrorKind.UPSTREAM
    assert "the database is locked" in failed.error.message, failed.error.message
    assert f"JSON-RPC code {code}" in failed.error.message
    assert after.status == "completed" and health.restarts == 0
