"""Paging inside a long line: server-everything's echo of a 1 MB single line is cut inside
that line; the marker says where to read on; `managed_read` pages through it by characters,
and reading never retains the text again under a new ref."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bridges.manifest.loading import ServerConfig
from bridges.mcp import ServerPool
from sidecar import Location, TextContent
from tests.bridges.helpers import ctx

pytestmark = pytest.mark.anyio

EVERYTHING = "npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js"
LINE = "".join(f"<{i:07d}é>" for i in range(100_000))  # 1.1 M characters, no newline


async def test_a_one_line_result_is_readable_end_to_end_by_characters(
    location: Location, published_servers: Path
) -> None:
    config = ServerConfig(command="node", args=[str(published_servers / EVERYTHING), "stdio"])
    async with ServerPool({"ev": config}, location.tools) as pool:
        assert pool.health()["ev"].state == "ready", pool.health()["ev"].last_error
        echo = await location.snapshot().execute("ev_echo", {"message": LINE}, ctx())
    assert echo.status == "completed", echo.error
    full = "Echo: " + LINE
    (preview,) = echo.content
    assert isinstance(preview, TextContent)
    (retained,) = echo.managed
    marker = re.search(r'managed_read\(ref="(m_\w+)", offset=1, start=(\d+)\)', preview.text)
    assert marker is not None, preview.text[:200]
    ref, start = marker.group(1), int(marker.group(2))
    assert ref == retained.ref and "from character" in preview.text
    assert full.startswith(preview.text[:start])  # the head ends exactly there

    snapshot = location.snapshot()
    pages, position, reads = [], start, 0
    while True:
        page = await snapshot.execute(
            "managed_read", {"ref": ref, "offset": 1, "start": position}, ctx())
        reads += 1
        assert page.status == "completed", page.error
        assert page.managed == ()  # within the bound: never a new ref
        (item,) = page.content
        assert isinstance(item, TextContent)
        header, _, text = item.text.partition("\n")
        assert header.startswith(f"[{ref}: line 1 of 1, characters {position:,}-")
        pages.append(text)
        position += len(text)
        following = re.search(r"continue with offset=1, start=(\d+)\]$", header)
        if following is None:
            assert header.endswith("; end of the text]")
            break
        assert int(following.group(1)) == position
    assert full[:start] + "".join(pages) == full
    assert reads > 10

    # the old way (a line offset only) no longer re-bounds the line under a new ref
    by_line = await snapshot.execute("managed_read", {"ref": ref, "offset": 1}, ctx())
    assert by_line.managed == ()
    assert "continue with offset=1, start=" in by_line.content[0].text  # type: ignore[union-attr]

    exact = await snapshot.execute(
        "managed_read", {"ref": ref, "offset": 1, "start": 6, "length": 10}, ctx())
    assert exact.content[0].text.split("\n", 1)[1] == LINE[:10]  # type: ignore[union-attr]
    past = await snapshot.execute(
        "managed_read", {"ref": ref, "offset": 1, "start": len(full) + 5}, ctx())
    assert "has no characters from" in past.content[0].text  # type: ignore[union-attr]
