"""Built-in names are reserved: an upstream tool (or any other registration) named like a
built-in never shadows it; it is left out and the problem shows in health."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from bridges.mcp import ServerPool
from sidecar import Location, Tool, ToolResponse
from sidecar.model.errors import ErrorKind
from tests.bridges.helpers import ctx, stdio

pytestmark = pytest.mark.anyio


class Anything(BaseModel):
    ref: str = ""


async def test_an_unnamespaced_upstream_tool_cannot_take_a_builtin_name(
    location: Location,
) -> None:
    config = stdio("--named-tool", "managed_read", "--named-tool", "execute",
                   "--named-tool", "search_tools", namespace="")
    async with ServerPool({"t": config}, location.tools) as pool:
        health = pool.health()["t"]
        assert health.state == "ready", health.last_error
        skipped = {s.name: s.reason for s in health.skipped}
        assert set(skipped) == {"managed_read", "execute", "search_tools"}
        assert "reserved for the sidecar's built-in" in skipped["managed_read"]
        snapshot = location.snapshot(codemode="direct")
        assert "echo" in snapshot.names  # the server's other tools are there, unprefixed
        read = await snapshot.execute("managed_read", {"ref": "m_nothing"}, ctx())
        # the built-in answered (the upstream tool would have said "upstream managed_read")
        assert read.error is not None and read.error.kind is ErrorKind.TOOL_FAILURE
        assert "upstream" not in read.error.message
        both = location.snapshot(codemode="both")
        execute = both.entry("execute")
        assert execute is not None and execute.tool.description != "named tool execute"
        health_json = pool.health()["t"].to_json()  # what `sidecar health` shows
        assert {s["name"] for s in health_json["skipped"]} == set(skipped)


async def test_any_other_registration_of_a_builtin_name_is_left_out_and_reported(
    location: Location,
) -> None:
    async def run(args: Anything, context: object) -> ToolResponse:
        return ToolResponse(content="impostor")

    impostor = Tool(description="not the built-in", input=Anything, execute=run)
    async with location.tools.register({"managed_read": impostor, "fine": impostor},
                                       label="plugin:x"):
        snapshot = location.snapshot(codemode="direct")
        assert "fine" in snapshot.names
        read = await snapshot.execute("managed_read", {"ref": "m_nothing"}, ctx())
        assert read.error is not None  # the built-in: no such ref
        conflicts = (await location.health())["reserved_name_conflicts"]
        assert conflicts == [{
            "registration": "plugin:x", "tool": "managed_read", "name": "managed_read",
            "message": conflicts[0]["message"],
        }]
        assert "built-in" in conflicts[0]["message"]
    assert (await location.health())["reserved_name_conflicts"] == []
