"""The stdio fast path (`sidecar.serve.mcp_facade.stdio_fastpath`) in-process: which calls it takes,
and that its answers are the ones the SDK's path gives."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError
from mcp.shared.memory import create_client_server_memory_streams

from sidecar import Location
from sidecar.serve.mcp_facade.server import McpFacade
from sidecar.serve.mcp_facade.stdio_fastpath import FastCalls
from tests.serve.mcp_facade.conftest import local_tools

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def stdio_facade(location: Location) -> AsyncIterator[tuple[McpFacade, FastCalls, Any]]:
    """The facade as `serve_stdio` runs it, over in-memory streams: (facade, its fast path, a
    connected `ClientSession`)."""
    facade = McpFacade(location, session_id="stdio-test")
    async with facade.attached(), create_client_server_memory_streams() as (
        client_streams, server_streams
    ), anyio.create_task_group() as tg:
        read, write = server_streams
        fast = FastCalls(facade, read, write)
        options = facade.server.create_initialization_options()
        tg.start_soon(facade.server.run, fast, write, options)
        async with ClientSession(*client_streams) as session:
            yield facade, fast, session
        await fast.close()
        tg.cancel_scope.cancel()


async def call(session: ClientSession, name: str, arguments: dict[str, Any],
               **kwargs: Any) -> types.CallToolResult:
    """A raw tools/call (ClientSession.call_tool would list tools first to check outputs)."""
    request = types.CallToolRequest(params=types.CallToolRequestParams(
        name=name, arguments=arguments))
    return await session.send_request(request, types.CallToolResult, **kwargs)


async def test_fast_path_takes_plain_calls_and_leaves_the_rest(tmp_path: Path) -> None:
    async with Location.open(tmp_path, state_dir=tmp_path / "state") as location:
        location.tools.register(local_tools())
        async with stdio_facade(location) as (_facade, fast, session):
            await session.initialize()
            before = await call(session, "echo", {"text": "early"})
            assert before.structured_content == {"echoed": "early"}
            assert fast.handled == 0  # the session's first request: the SDK's path
            await session.list_tools()
            assert fast.handled == 1
            plain = await call(session, "echo", {"text": "early"})
            assert fast.handled == 2
            assert plain.model_dump() == before.model_dump()  # same answer on both paths
            wrapped = await call(session, "numbers", {"text": "x"})
            assert wrapped.structured_content == {"result": [1, 2, 3]}
            invalid = await call(session, "echo", {"text": 5})
            assert invalid.is_error and "text" in invalid.content[0].text
            missing = await call(session, "nope", {})
            assert missing.is_error
            assert fast.handled == 5
            seen: list[float] = []

            async def progress(value: float, total: float | None, message: str | None) -> None:
                seen.append(value)

            slow_path = await call(session, "echo", {"text": "p"},
                                   progress_callback=progress)
            assert slow_path.structured_content == {"echoed": "p"}
            assert fast.handled == 5  # a progressToken: the SDK's path


async def test_tool_listing_is_reused_until_the_registry_changes(tmp_path: Path) -> None:
    async with Location.open(tmp_path, state_dir=tmp_path / "state") as location:
        location.tools.register(local_tools())
        async with stdio_facade(location) as (facade, fast, session):
            await session.initialize()
            first = await session.list_tools()  # the SDK's path: the session is new
            assert fast.handled == 0 and len(facade.served.listings) == 1
            again = await session.list_tools()  # the fast path, from its own cache
            assert fast.handled == 1 and len(facade.fast.wire_listings) == 1
            assert again == first  # the same listing either way
            await session.list_tools()
            assert fast.handled == 2 and len(facade.fast.wire_listings) == 1
            location.tools.register({"later": local_tools()["echo"]})
            names = [t.name for t in (await session.list_tools()).tools]
            assert "later" in names and len(facade.fast.wire_listings) == 2


async def test_a_tool_registered_after_the_listing_is_called_without_listing_again(
    tmp_path: Path,
) -> None:
    """A server that settles between a session's listing and its call (the listing said it
    was starting) has its tools registered by then: the call finds them on both paths."""
    async with Location.open(tmp_path, state_dir=tmp_path / "state") as location:
        location.tools.register(local_tools())
        async with stdio_facade(location) as (_facade, fast, session):
            await session.initialize()
            await session.list_tools()
            await session.list_tools()  # the fast path holds the session's snapshot now
            location.tools.register({"later": local_tools()["echo"]})
            handled = fast.handled
            plain = await call(session, "later", {"text": "fast"})
            assert not plain.is_error, plain.content
            assert plain.structured_content == {"echoed": "fast"}
            assert fast.handled == handled + 1
            location.tools.register({"later2": local_tools()["echo"]})

            async def progress(value: float, total: float | None, message: str | None) -> None:
                pass

            slow = await call(session, "later2", {"text": "sdk"}, progress_callback=progress)
            assert not slow.is_error, slow.content
            assert slow.structured_content == {"echoed": "sdk"}
            assert fast.handled == handled + 1  # a progressToken: the SDK's path
            missing = await call(session, "never", {})
            assert missing.is_error and "Unknown tool: never" in missing.content[0].text


async def test_a_bug_below_the_fast_path_is_answered_as_an_internal_error_and_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async with Location.open(tmp_path, state_dir=tmp_path / "state") as location:
        location.tools.register(local_tools())
        async with stdio_facade(location) as (facade, fast, session):
            await session.initialize()
            await session.list_tools()

            async def broken(*args: Any) -> dict[str, Any]:
                raise RuntimeError("a bug in result mapping")

            # Fault injection: no real input reaches this state, so the fast answer is
            # replaced; what is under test is the fast path's answer when it raises.
            monkeypatch.setattr(facade.fast, "call", broken)
            with anyio.fail_after(10), pytest.raises(MCPError) as info:
                await call(session, "echo", {"text": "x"})
            assert info.value.error.code == types.INTERNAL_ERROR
            assert "a bug in result mapping" not in info.value.error.message  # no internals
            assert fast.handled == 1  # the fast path took it (the first listing was the SDK's)
            monkeypatch.undo()
            after = await call(session, "echo", {"text": "still served"})
            assert after.structured_content == {"echoed": "still served"}
            assert fast.handled == 2
    assert any(r.message == "a fast-path request failed" and r.exc_info
               and "a bug in result mapping" in str(r.exc_info[1]) for r in caplog.records)
