"""Resource updates from 2026-07-28 upstreams: a client's `resources/subscribe` (or its own
`subscriptions/listen` filter) is asked for on the upstream's listen stream, and the upstream's
`notifications/resources/updated` reaches exactly the sessions subscribed to that URI, with the
facade's (namespaced) URI; over /mcp and over stdio. The upstreams are the conformance fixture
(the SDK's `ListenHandler`), connected at 2026-07-28 (`protocol = "auto"`)."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.subscriptions import ResourceUpdated

from tests.serve.mcp_facade.conftest import HARNESS, fixture_server, serving, write_manifest
from tests.serve.mcp_facade.test_http import connect

pytestmark = pytest.mark.anyio
WATCHED = "test://watched-resource"
STATIC = "test://static-text"


class Updates:
    """The `notifications/resources/updated` URIs one client received, in order."""

    def __init__(self) -> None:
        self.uris: list[str] = []

    async def on_message(self, message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            self.uris.append(str(message.params.uri))

    async def until(self, uri: str, count: int = 1) -> None:
        with anyio.fail_after(10):
            while self.uris.count(uri) < count:  # noqa: ASYNC110
                await anyio.sleep(0.02)


async def subscribe(client: Client, uri: str, *, on: bool = True) -> None:
    with warnings.catch_warnings():  # resources/subscribe is gone in 2026-07-28 only
        warnings.simplefilter("ignore")
        if on:
            await client.subscribe_resource(uri)
        else:
            await client.unsubscribe_resource(uri)


async def eventually(check: Callable[[], bool]) -> None:
    with anyio.fail_after(10):
        while not check():  # noqa: ASYNC110
            await anyio.sleep(0.02)


async def test_updates_reach_only_the_subscribed_sessions_with_the_facade_uri(
    tmp_path: Path,
) -> None:
    servers = {"one": fixture_server(namespace="a", protocol="auto"),
               "two": fixture_server(namespace="b", protocol="auto")}
    a, b = Updates(), Updates()
    async with serving(tmp_path, servers) as served:
        pool = served.location.upstreams
        assert pool is not None
        one = pool.connection("one")
        assert one is not None and one.modern
        async with connect(served.url, "legacy", message_handler=a.on_message) as client_a:
            async with connect(served.url, "legacy", message_handler=b.on_message) as client_b:

                async def update(uri: str) -> None:
                    result = await client_a.call_tool("a_test_update_resource", {"uri": uri})
                    assert result.content[0].text == f"updated {uri}", result.content

                await subscribe(client_a, f"a+{WATCHED}")
                await subscribe(client_b, f"a+{STATIC}")  # b's marker: updates come in order
                assert one.watched.uris() == [STATIC, WATCHED]
                await update(WATCHED)
                await a.until(f"a+{WATCHED}")
                await update(STATIC)
                await b.until(f"a+{STATIC}")
                assert b.uris == [f"a+{STATIC}"]  # not subscribed to the watched resource

                # counted: a's unsubscribe keeps b's subscription to the same resource
                await subscribe(client_b, f"a+{WATCHED}")
                await subscribe(client_a, f"a+{WATCHED}", on=False)
                await subscribe(client_a, f"a+{STATIC}")  # a's marker from here on
                await update(WATCHED)
                await b.until(f"a+{WATCHED}")
                await update(STATIC)
                await a.until(f"a+{STATIC}")
                assert a.uris == [f"a+{WATCHED}", f"a+{STATIC}"]
                assert b.uris == [f"a+{STATIC}", f"a+{WATCHED}", f"a+{STATIC}"]
            # b's session ended: what it alone held is no longer asked for
            await eventually(lambda: one.watched.uris() == [STATIC])
            await update(WATCHED)
            await update(STATIC)
            await a.until(f"a+{STATIC}", 2)
            assert a.uris == [f"a+{WATCHED}", f"a+{STATIC}", f"a+{STATIC}"]
            await subscribe(client_a, f"a+{STATIC}", on=False)
            assert one.watched.uris() == []


async def test_a_2026_client_listens_for_updates_of_an_upstream_resource(
    tmp_path: Path,
) -> None:
    servers = {"one": fixture_server(namespace="a", protocol="auto"),
               "two": fixture_server(namespace="b", protocol="auto")}
    async with serving(tmp_path, servers) as served, connect(served.url, "2026-07-28") as client:
        pool = served.location.upstreams
        assert pool is not None
        one = pool.connection("one")
        assert one is not None
        async with client.listen(resource_subscriptions=[f"a+{WATCHED}"]) as subscription:
            assert subscription.honored.resource_subscriptions == [f"a+{WATCHED}"]
            assert one.watched.uris() == [WATCHED]
            await client.call_tool("a_test_update_resource", {"uri": STATIC})
            await client.call_tool("a_test_update_resource", {"uri": WATCHED})
            with anyio.fail_after(10):
                event = await anext(aiter(subscription))
            assert event == ResourceUpdated(uri=f"a+{WATCHED}")
        await eventually(lambda: one.watched.uris() == [])


async def test_updates_over_stdio(tmp_path: Path) -> None:
    manifests = write_manifest(tmp_path / "manifests",
                               {"fixture": fixture_server(protocol="auto")})
    params = StdioServerParameters(command=sys.executable, args=[
        str(HARNESS), "stdio", "--manifests", str(manifests),
        "--state-dir", str(tmp_path / "state"), "--root", str(tmp_path)])
    updates = Updates()
    async with Client(params, mode="legacy", cache=None, read_timeout_seconds=60,
                      message_handler=updates.on_message) as client:
        await subscribe(client, WATCHED)
        await client.call_tool("test_update_resource", {"uri": WATCHED})
        await updates.until(WATCHED)
        await subscribe(client, WATCHED, on=False)
        await subscribe(client, STATIC)
        await client.call_tool("test_update_resource", {"uri": WATCHED})
        await client.call_tool("test_update_resource", {"uri": STATIC})
        await updates.until(STATIC)
        assert updates.uris == [WATCHED, STATIC]


@pytest.mark.parametrize("protocol", ["auto", "legacy"])
async def test_subscriptions_outlive_a_restart_of_the_upstream(
    tmp_path: Path, protocol: str
) -> None:
    """A 2026-07-28 upstream's new listen stream asks for the held URIs; a handshake-era one
    is sent `resources/subscribe` again (its new session knows nothing of the old one's)."""
    updates = Updates()
    async with serving(tmp_path, {"one": fixture_server(protocol=protocol)}) as served, connect(
        served.url, "legacy", message_handler=updates.on_message
    ) as client:
        pool = served.location.upstreams
        assert pool is not None
        await subscribe(client, WATCHED)
        before = pool.connection("one")
        with anyio.fail_after(30):
            assert await pool.restart("one")
        after = pool.connection("one")
        assert after is not None and after is not before
        assert after.modern == (protocol == "auto")
        assert after.watched.uris() == [WATCHED]  # asked for by the new stream, or sent again
        # the fixture announces an update when a handshake-era session subscribes, and only
        # then to that session: the restarted server's session is subscribed again
        await eventually(lambda: protocol == "auto" or updates.uris.count(WATCHED) == 2)
        seen = updates.uris.count(WATCHED)
        await client.call_tool("test_update_resource", {"uri": WATCHED})
        await updates.until(WATCHED, seen + 1)
