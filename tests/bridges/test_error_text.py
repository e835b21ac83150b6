"""Error texts that help a model (and a person) fix the call: every schema error of the input,
the closest tool names, and a crash quoted from the server's own last words."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridges.manifest.loading import ServerConfig
from bridges.mcp import ServerPool
from sidecar import Location
from sidecar.model.errors import ErrorKind
from tests.bridges.helpers import ctx, eventually, stdio
from tests.bridges.test_supervision import FAST

pytestmark = pytest.mark.anyio

EVERYTHING = "npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js"


async def test_invalid_input_lists_every_schema_error(
    location: Location, published_servers: Path
) -> None:
    python = published_servers / "venv-time/bin/python"
    config = ServerConfig(command=str(python),
                          args=["-m", "mcp_server_time", "--local-timezone", "UTC"])
    async with ServerPool({"time": config}, location.tools) as pool:
        assert pool.health()["time"].state == "ready", pool.health()["time"].last_error
        bad = await location.snapshot().execute("time_convert_time", {"time": 12}, ctx())
    assert bad.error is not None and bad.error.kind is ErrorKind.INVALID_INPUT
    message = bad.error.message
    for wanted in ("'source_timezone' is a required property",
                   "'target_timezone' is a required property",
                   "$.time: 12 is not of type 'string'"):
        assert wanted in message, message
    assert "3 errors" in message and "more" not in message


async def test_unknown_tool_suggests_the_closest_names(
    location: Location, published_servers: Path
) -> None:
    config = ServerConfig(command="node", args=[str(published_servers / EVERYTHING), "stdio"])
    async with ServerPool({"ev": config}, location.tools) as pool:
        assert pool.health()["ev"].state == "ready", pool.health()["ev"].last_error
        snapshot = location.snapshot()
        typo = await snapshot.execute("ev_get-tiny-imag", {}, ctx())
        bare = await snapshot.execute("echo", {"message": "x"}, ctx())
        far = await snapshot.execute("completely_unrelated_name", {}, ctx())
    assert typo.error is not None and typo.error.kind is ErrorKind.UNKNOWN_TOOL
    assert typo.error.message.startswith(
        "Unknown tool: ev_get-tiny-imag. Did you mean: ev_get-tiny-image"), typo.error.message
    assert bare.error is not None
    assert bare.error.message.startswith("Unknown tool: echo. Did you mean: ev_echo")
    assert far.error is not None and "Did you mean" not in far.error.message
    assert "tools are available" in far.error.message or "Available tools" in far.error.message


async def test_a_crash_quotes_the_stderr_written_around_it(location: Location) -> None:
    # The server closes stdout first and writes its traceback afterwards, as a dying runtime
    # does: the message must wait for those words, not quote an older line.
    async with ServerPool({"t": stdio()}, location.tools, backoff=FAST) as pool:
        assert pool.health()["t"].state == "ready"
        crashed = await location.snapshot().execute("t_crash", {"stdout_first": True}, ctx())
    assert crashed.error is not None and crashed.error.kind is ErrorKind.UPSTREAM
    assert "boom at the crash" in crashed.error.message, crashed.error.message


async def test_a_silent_crash_does_not_quote_an_older_line_as_its_cause(
    location: Location
) -> None:
    async with ServerPool({"t": stdio()}, location.tools, backoff=FAST) as pool:
        snapshot = location.snapshot()
        first = await snapshot.execute("t_crash", {}, ctx())  # writes "about to crash"
        assert first.error is not None and "about to crash" in first.error.message
        await eventually(lambda: pool.health()["t"].state == "ready", what="the restart")
        killed = await snapshot.execute("t_crash", {"quietly": True}, ctx())
    assert killed.error is not None and killed.error.kind is ErrorKind.UPSTREAM
    message = killed.error.message
    assert "it wrote nothing to stderr during the call (earlier: about to crash)" in message
