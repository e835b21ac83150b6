"""The facade under test: a Location with the conformance fixture upstream (namespace "") and
local tools, served on a real uvicorn (127.0.0.1, port 0) or by a stdio subprocess."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from pydantic import BaseModel, TypeAdapter

from sidecar import Location, Tool
from sidecar.serve.app import build_app
from sidecar.serve.mcp_facade import mcp_http
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


def write_manifest(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "servers.json").write_text(json.dumps({"mcpServers": {"fixture": {
        "command": sys.executable, "args": [str(FIXTURE)], "namespace": "",
        "protocol": "legacy"}}}))
    return directory


@dataclass
class Served:
    url: str
    location: Location


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    manifests = write_manifest(tmp_path / "manifests")
    async with Location.open(
        tmp_path, state_dir=tmp_path / "state", manifests=[manifests]
    ) as location:
        location.tools.register(local_tools())
        routes, lifespan = mcp_http(location)
        app = build_app(location, token=TOKEN, extra_routes=routes, extra_lifespan=lifespan)
        async with live_server(app) as port:
            yield Served(f"http://127.0.0.1:{port}/mcp", location)
