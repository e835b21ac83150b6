"""Code Mode fixtures: a real Location, a real monty worker pool, tools of every kind."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import psutil
import pytest
from pydantic import BaseModel, Field

from sidecar import Location, Tool, ToolContext, ToolFailure, ToolResponse
from sidecar.codemode import CodeModeLimits, Sandbox, codemode_snapshot
from sidecar.execution.snapshot import Snapshot
from sidecar.model.outcome import Outcome
from sidecar.model.permissions import PermissionRequest


class AddIn(BaseModel):
    a: int
    b: int = Field(0, description="The second addend")


class AddOut(BaseModel):
    sum: int


ISSUE_SEARCH_IN = {
    "type": "object",
    "properties": {
        "query": {"type": "string", "description": "Words to look for"},
        "state": {"enum": ["open", "closed"]},
        "limit": {"type": "integer", "minimum": 1, "default": 5},
    },
    "required": ["query"],
    "additionalProperties": False,
}
ISSUE_SEARCH_OUT = {
    "type": "object",
    "properties": {
        "issues": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"id": {"type": "integer"}, "title": {"type": "string"}},
                "required": ["id", "title"],
            },
        },
    },
    "required": ["issues"],
}
SLOW_IN = {
    "type": "object",
    "properties": {"seconds": {"type": "number"}, "label": {"type": "string"}},
    "required": ["seconds"],
}


@dataclass
class Probe:
    """What the tools saw: contexts, cancellations, concurrency."""

    contexts: list[ToolContext] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    inflight: int = 0
    max_inflight: int = 0
    started: asyncio.Event = field(default_factory=asyncio.Event)


def make_tools(location: Location, probe: Probe) -> dict[str, Tool]:
    async def add(args: AddIn, ctx: Any) -> AddOut:
        probe.contexts.append(ctx.runner)
        return AddOut(sum=args.a + args.b)

    async def search(args: dict[str, Any], ctx: Any) -> dict[str, Any]:
        found = [{"id": i, "title": f"{args['query']} #{i}"} for i in range(args.get("limit", 5))]
        return {"issues": found}

    async def get_issue(args: dict[str, Any], ctx: Any) -> ToolResponse:
        return ToolResponse(content=f"Issue {args['id']}: body text")

    async def fail(args: dict[str, Any], ctx: Any) -> None:
        raise ToolFailure("the upstream said no")

    async def slow(args: dict[str, Any], ctx: Any) -> ToolResponse:
        probe.inflight += 1
        probe.max_inflight = max(probe.max_inflight, probe.inflight)
        probe.started.set()
        try:
            await asyncio.sleep(args["seconds"])
        except asyncio.CancelledError:
            probe.cancelled.append(ctx.call_id)
            raise
        finally:
            probe.inflight -= 1
        return ToolResponse(content=f"slept {args.get('label', '')}".strip())

    async def guarded(args: dict[str, Any], ctx: Any) -> ToolResponse:
        await location.permissions.ask(PermissionRequest(
            session_id=ctx.session_id, agent=ctx.agent, message_id=ctx.message_id,
            call_id=ctx.call_id, action="guarded",
        ))
        return ToolResponse(content="guarded ran")

    async def secret(args: dict[str, Any], ctx: Any) -> ToolResponse:
        return ToolResponse(content="direct only")

    empty = {"type": "object", "properties": {}}
    return {
        "add": Tool(description="Add two integers.", input=AddIn, output=AddOut, execute=add,
                    namespace="calc", title="Addition"),
        "search": Tool(description="Search issues by words in their titles.",
                       input=ISSUE_SEARCH_IN, output=ISSUE_SEARCH_OUT, execute=search,
                       namespace="issues"),
        "get": Tool(description="Read one issue.", execute=get_issue, namespace="issues",
                    input={"type": "object", "properties": {"id": {"type": "integer"}},
                           "required": ["id"]}),
        "fail": Tool(description="Always fails.", input=empty, execute=fail),
        "slow": Tool(description="Sleep for a while.", input=SLOW_IN, execute=slow),
        "guarded": Tool(description="Asks for permission first.", input=empty,
                        execute=guarded),
        "secret": Tool(description="Only callable directly.", input=empty, execute=secret,
                       codemode=False),
    }


@dataclass
class Env:
    location: Location
    sandbox: Sandbox
    probe: Probe

    def snapshot(self, *, mode: str = "codemode", limits: CodeModeLimits | None = None,
                 **options: Any) -> Snapshot:
        return codemode_snapshot(
            self.location.seam, self.location.registry.effective(), mode=mode,  # type: ignore[arg-type]
            sandbox=self.sandbox, limits=limits or CodeModeLimits(), **options,
        )

    async def run(self, code: str, call_id: str = "c1", *,
                  limits: CodeModeLimits | None = None, session: str = "s1") -> Outcome:
        snapshot = self.snapshot(limits=limits)
        return await snapshot.execute("execute", {"code": code}, ctx(call_id, session))


def ctx(call_id: str = "c1", session: str = "s1") -> ToolContext:
    return ToolContext(session_id=session, agent="agent-1", message_id="m1", call_id=call_id)


def monty_workers() -> set[int]:
    """Live monty worker processes under this test process."""
    return {
        p.pid for p in psutil.Process().children(recursive=True)
        if _is_monty(p)
    }


def _is_monty(process: psutil.Process) -> bool:
    try:
        return process.name() == "monty" and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def wait_until(predicate: Any) -> None:
    for _ in range(1000):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached in time")


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
async def env(tmp_path) -> AsyncIterator[Env]:
    async with Location.open(tmp_path, state_dir=tmp_path / "state") as location:
        probe = Probe()
        async with Sandbox(max_workers=2) as sandbox:
            async with location.tools.register(make_tools(location, probe)):
                yield Env(location, sandbox, probe)
