"""Fixtures of the bridge tests: a real Location, real servers, the published servers."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from sidecar import Location
from tests.bridges.helpers import DEPS, HttpServers, SharedServer


@pytest.fixture
async def location(tmp_path: Path) -> AsyncIterator[Location]:
    async with Location.open(tmp_path, state_dir=tmp_path / "state") as loc:
        yield loc


@pytest.fixture
def events(tmp_path: Path) -> Path:
    """A file the test servers append observable events to (their --events)."""
    return tmp_path / "events.jsonl"


@pytest.fixture
def http_servers() -> Iterator[HttpServers]:
    servers = HttpServers()
    try:
        yield servers
    finally:
        servers.close()


@pytest.fixture(scope="session")
def shared_http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedServer]:
    """One SDK test server over streamable HTTP for tests that do not change its state
    (starting a server costs about a second of CPU; this one is started once)."""
    events = tmp_path_factory.mktemp("shared") / "events.jsonl"
    servers = HttpServers()
    try:
        url, _ = servers.start_testserver("http", "--events", str(events))
        yield SharedServer(url, events)
    finally:
        servers.close()


@pytest.fixture(scope="session")
def published_servers() -> Path:
    """The published servers installed by scripts/bootstrap-servers (never skipped)."""
    needed = [
        DEPS / "npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js",
        DEPS / "venv-time/bin/python",
    ]
    missing = [str(p) for p in needed if not p.exists()]
    if missing:
        pytest.fail(
            "the published MCP servers are not installed (missing: " + ", ".join(missing)
            + "); run scripts/bootstrap-servers first",
            pytrace=False,
        )
    return DEPS
