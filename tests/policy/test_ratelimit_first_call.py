"""A one-call bucket on the real clock: the first call passes, the next is refused. (The
bucket of a tool's first call is made after the call read the clock; a refill over that
negative instant used to leave it just short of one token, refusing the first call.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from sidecar import Location, Tool, ToolContext, ToolResponse
from sidecar.policy.ratelimit import RateLimit

pytestmark = pytest.mark.anyio


class EchoIn(BaseModel):
    text: str


async def echo(args: EchoIn, ctx: object) -> ToolResponse:
    return ToolResponse(content=args.text)


async def test_a_one_call_per_minute_limit_lets_the_first_call_through(tmp_path: Path) -> None:
    async with Location.open(root=tmp_path, state_dir=tmp_path / "state") as loc:
        async with loc.tools.register({"echo": Tool(description="Echo", input=EchoIn,
                                                    execute=echo)}):
            loc.rate_limits.set({"echo": RateLimit(calls_per_minute=1)}, {}, {})
            loc.profiles.changed()
            snap = loc.snapshot()
            first = await snap.execute("echo", {"text": "a"}, ToolContext("s", "a", "m", "c1"))
            assert first.status == "completed", first.error
            second = await snap.execute("echo", {"text": "b"}, ToolContext("s", "a", "m", "c2"))
            assert second.error is not None and second.error.message.startswith(
                "Rate limit: tool echo allows 1 calls per minute; retry in ")
