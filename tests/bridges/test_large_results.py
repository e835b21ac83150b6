"""Large upstream results over stdio: bounded through the seam, retained whole, readable with
managed_read; past max_result_bytes a clear error, and the connection survives."""

from __future__ import annotations

import pytest

from bridges.mcp import ServerPool
from sidecar import Location, TextContent
from sidecar.model.errors import ErrorKind
from tests.bridges.helpers import ctx, stdio

pytestmark = pytest.mark.anyio

FIVE_MB = 5_000_000
TWENTY_MB = 20_000_000  # past STREAM_LINES_AT: parsed as it arrives


@pytest.mark.parametrize("size", [FIVE_MB, TWENTY_MB])  # the second one is streamed
async def test_a_large_result_is_bounded_and_the_rest_is_readable(
    location: Location, size: int
) -> None:
    async with ServerPool({"t": stdio()}, location.tools):
        snapshot = location.snapshot()
        outcome = await snapshot.execute("t_big", {"bytes": size, "line": 100}, ctx())
        assert outcome.status == "completed", outcome.error
        (preview,) = outcome.content
        assert isinstance(preview, TextContent)
        assert len(preview.text.encode()) <= 50 * 1024  # the default bound
        (retained,) = outcome.managed
        assert retained.size_bytes == size
        assert retained.lines == size // 100
        assert retained.ref in preview.text and "managed_read" in preview.text

        last = await snapshot.execute(
            "managed_read", {"ref": retained.ref, "offset": retained.lines - 1, "limit": 5}, ctx()
        )
        assert last.status == "completed"
        (text,) = last.content
        assert isinstance(text, TextContent)
        body = text.text.splitlines()
        assert f"of {retained.lines:,}" in body[0]
        assert body[1:] == ["x" * 99, "x" * 99]


async def test_past_max_result_bytes_the_call_fails_clearly_and_the_server_stays(
    location: Location,
) -> None:
    config = stdio(max_result_bytes=1_000_000)
    async with ServerPool({"t": config}, location.tools) as pool:
        snapshot = location.snapshot()
        too_big = await snapshot.execute("t_big", {"bytes": 2_000_000}, ctx())
        assert too_big.error is not None and too_big.error.kind is ErrorKind.UPSTREAM
        assert "max_result_bytes" in too_big.error.message
        assert "'t'" in too_big.error.message and "'big'" in too_big.error.message
        fine = await snapshot.execute("t_echo", {"text": "ok"}, ctx())
        assert fine.content == (TextContent("ok"),)
        assert pool.health()["t"].restarts == 0


async def test_past_max_result_bytes_while_streaming_the_call_fails_clearly(
    location: Location,
) -> None:
    """The line is already being parsed as it arrives (past 8 MiB) when it passes the limit."""
    async with ServerPool({"t": stdio(max_result_bytes=10_000_000)}, location.tools) as pool:
        snapshot = location.snapshot()
        too_big = await snapshot.execute("t_big", {"bytes": 12_000_000}, ctx())
        assert too_big.error is not None and too_big.error.kind is ErrorKind.UPSTREAM
        assert "max_result_bytes" in too_big.error.message
        fine = await snapshot.execute("t_echo", {"text": "ok"}, ctx())
        assert fine.content == (TextContent("ok"),)
        assert pool.health()["t"].restarts == 0
