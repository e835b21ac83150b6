"""A real `sidecar serve` app on uvicorn, 127.0.0.1, random port, with test tools."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest
from pydantic import BaseModel

from sidecar import Location, Tool, ToolResponse
from sidecar.model.permissions import PermissionRequest, PermissionRule
from sidecar.serve.app import build_app
from tests.live_server import live_server

TOKEN = "test-token-123"


class EchoIn(BaseModel):
    text: str


class EchoOut(BaseModel):
    echoed: str


class SlowIn(BaseModel):
    seconds: float = 30.0


@dataclass
class Served:
    url: str
    location: Location
    client: httpx.AsyncClient


def make_tools(location: Location) -> dict[str, Tool]:
    async def echo(args: EchoIn, ctx) -> EchoOut:
        return EchoOut(echoed=args.text)

    async def slow(args: SlowIn, ctx) -> ToolResponse:
        ctx.progress({"stage": "sleeping"})
        await asyncio.sleep(args.seconds)
        return ToolResponse(content="woke up")

    async def big(args: EchoIn, ctx) -> ToolResponse:
        return ToolResponse(content="\n".join(f"{args.text} line {i}" for i in range(20_000)))

    async def guarded(args: EchoIn, ctx) -> ToolResponse:
        await location.permissions.ask(PermissionRequest(
            session_id=ctx.session_id, agent=ctx.agent, message_id=ctx.message_id,
            call_id=ctx.call_id, action="guarded",
        ))
        return ToolResponse(content=f"guarded {args.text}")

    return {
        "echo": Tool(description="Echo text", input=EchoIn, output=EchoOut, execute=echo),
        "slow": Tool(description="Sleep", input=SlowIn, execute=slow),
        "big": Tool(description="Many lines", input=EchoIn, execute=big),
        "guarded": Tool(description="Asks first", input=EchoIn, execute=guarded),
    }


@pytest.fixture
async def served(tmp_path) -> AsyncIterator[Served]:
    async with Location.open(
        tmp_path, state_dir=tmp_path / "state",
        permission_defaults=[PermissionRule("guarded", "ask")],
    ) as location:
        location.tools.register(make_tools(location))
        app = build_app(location, token=TOKEN, max_body_bytes=64 * 1024)
        async with live_server(app) as port:
            url = f"http://127.0.0.1:{port}"
            headers = {"authorization": f"Bearer {TOKEN}"}
            async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as client:
                yield Served(url, location, client)
