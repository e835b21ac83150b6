"""The facade under test: a Location with the conformance fixture upstream (namespace "") and
local tools, served on a real uvicorn (127.0.0.1, port 0) or by a stdio subprocess."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from pydantic import BaseModel, TypeAdapter

from sidecar import Location, Tool
from sidecar.serve.app import build_app
from sidecar.serve.mcp_facade import mcp_http
from sidecar.serve.mcp_facade.http_fastpath import HttpFastPath
from sidecar.serve.mcp_facade.transports import McpEndpoint
from tests.live_server import live_server

HERE = Path(__file__).resolve().parent
FIXTURE = HERE / "servers" / "conformance_fixture.py"
HARNESS = HERE / "harness.py"
TOKEN = "facade-token"


class EchoIn(BaseModel):
    text: str


class EchoOut(BaseModel):
    echoed: str


def local_tools() -> dict[str, Tool]:
    async def echo(args: EchoIn, ctx: object) -> EchoOut:
        return EchoOut(echoed=args.text)

    async def numbers(args: EchoIn, ctx: object) -> list[int]:
        return [1, 2, 3]

    return {
        "echo": Tool(description="Echo text", input=EchoIn, output=EchoOut, execute=echo),
        "numbers": Tool(description="A list", input=EchoIn, output=TypeAdapter(list[int]),
                        execute=numbers),
    }


def fixture_server(*, namespace: str = "", protocol: str = "legacy") -> dict[str, object]:
    return {"command": sys.executable, "args": [str(FIXTURE)], "namespace": namespace,
            "protocol": protocol}


def write_manifest(directory: Path, servers: dict[str, object] | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    entries = servers if servers is not None else {"fixture": fixture_server()}
    (directory / "servers.json").write_text(json.dumps({"mcpServers": entries}))
    return directory


@dataclass
class Served:
    url: str
    location: Location
    fast_path: HttpFastPath


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    async with serving(tmp_path) as served:
        yield served


@asynccontextmanager
async def serving(
    tmp_path: Path, servers: dict[str, object] | None = None
) -> AsyncIterator[Served]:
    """The facade on a live uvicorn over a Location with `servers` upstream (default: one
    conformance fixture, namespace "", handshake era)."""
    manifests = write_manifest(tmp_path / "manifests", servers)
    async with Location.open(
        tmp_path, state_dir=tmp_path / "state", manifests=[manifests]
    ) as location:
        location.tools.register(local_tools())
        routes, lifespan = mcp_http(location)
        app = build_app(location, token=TOKEN, extra_routes=routes, extra_lifespan=lifespan)
        endpoint = routes[0].endpoint  # type: ignore[attr-defined]
        assert isinstance(endpoint, McpEndpoint)
        async with live_server(app) as port:
            yield Served(f"http://127.0.0.1:{port}/mcp", location, endpoint.fast_path)
