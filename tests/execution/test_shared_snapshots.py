"""Snapshots made by one Location (one replica) are found and executed by another that shares
its `SnapshotRecords`: rebuilt from the recipe with the other's own tools, or refused with
`SnapshotExpired` when those tools differ from the ones advertised."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import pytest
from pydantic import BaseModel

from sidecar import Location, Tool, ToolContext, ToolResponse
from sidecar.backends.local.snapshot_records import MemorySnapshotRecords
from sidecar.daemon.daemon import DEFAULT_WIRING, open_local_stores
from sidecar.execution.snapshot import SnapshotExpired
from sidecar.location.ports import StoreOptions, Stores
from sidecar.model.content import TextContent
from sidecar.stores.snapshot_records import SnapshotRecords

pytestmark = pytest.mark.anyio


class EchoIn(BaseModel):
    text: str


def echo(description: str = "Echo text", tag: str = "") -> Tool:
    async def run(args: EchoIn, context: object) -> ToolResponse:
        return ToolResponse(content=tag + args.text)

    return Tool(description=description, input=EchoIn, execute=run)


def ctx(call_id: str) -> ToolContext:
    return ToolContext(session_id="s1", agent="a", message_id="m", call_id=call_id)


@asynccontextmanager
async def replica(tmp_path: Path, name: str, records: SnapshotRecords,
                  ) -> AsyncIterator[Location]:
    @asynccontextmanager
    async def stores(options: StoreOptions) -> AsyncIterator[Stores]:
        async with open_local_stores(options) as opened:
            yield dataclasses.replace(opened, snapshots=records)

    wiring = dataclasses.replace(DEFAULT_WIRING, open_stores=stores)
    async with Location.open(tmp_path / name, state_dir=tmp_path / name / "state",
                             wiring=wiring) as location:
        yield location


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[tuple[Location, Location]]:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    records = MemorySnapshotRecords()
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(replica(tmp_path, "a", records))
        b = await stack.enter_async_context(replica(tmp_path, "b", records))
        yield a, b


async def test_a_snapshot_made_on_one_replica_runs_on_the_other(
    pair: tuple[Location, Location],
) -> None:
    a, b = pair
    a.tools.register({"echo": echo(tag="a:"), "other": echo()})
    b.tools.register({"echo": echo(tag="b:"), "other": echo()})
    made = a.snapshot(session_id="s1", deny=["other"], strict=True, owner="token:t1")
    await a.share_snapshot(made)
    found = await b.find_snapshot(made.id)
    assert found.id == made.id and found is not made
    assert found.definitions == made.definitions
    assert found.recipe is not None and found.recipe.strict
    assert found.owner == "token:t1"  # counts against the same scoped token on B
    outcome = await found.execute("echo", {"text": "hi"}, ctx("c1"))
    assert outcome.status == "completed", outcome.error
    assert outcome.content[0] == TextContent("b:hi")  # B's own tool value ran
    denied = await found.execute("other", {"text": "x"}, ctx("c2"))
    assert denied.error is not None and denied.error.kind == "unavailable"
    assert await b.find_snapshot(made.id) is found  # kept locally from now on


async def test_final_step_and_code_mode_survive_the_trip(pair: tuple[Location, Location]) -> None:
    a, b = pair
    for location in pair:
        location.tools.register({"echo": echo()})
    made = a.snapshot(session_id="s1", final_step=True, codemode="both")
    await a.share_snapshot(made)
    found = await b.find_snapshot(made.id)
    assert found.tool_choice == "none" and found.names == made.names
    assert {"execute", "echo"} <= set(found.names)


async def test_different_definitions_on_the_other_replica_are_refused(
    pair: tuple[Location, Location],
) -> None:
    a, b = pair
    a.tools.register({"echo": echo("Echo text")})
    b.tools.register({"echo": echo("Echo text, changed upstream")})
    made = a.snapshot(session_id="s1")
    await a.share_snapshot(made)
    with pytest.raises(SnapshotExpired, match="differ"):
        await b.find_snapshot(made.id)


async def test_a_tool_missing_on_the_other_replica_is_named(
    pair: tuple[Location, Location],
) -> None:
    a, b = pair
    a.tools.register({"echo": echo(), "only_on_a": echo()})
    b.tools.register({"echo": echo()})
    made = a.snapshot(session_id="s1")
    await a.share_snapshot(made)
    with pytest.raises(SnapshotExpired, match="only_on_a"):
        await b.find_snapshot(made.id)


async def test_unknown_and_unshared_ids_stay_expired(pair: tuple[Location, Location]) -> None:
    a, b = pair
    a.tools.register({"echo": echo()})
    local_only = a.snapshot(session_id="s1")  # kept here, never shared
    assert await a.find_snapshot(local_only.id) is local_only
    for missing in (local_only.id, "snap_nope"):
        with pytest.raises(SnapshotExpired):
            await b.find_snapshot(missing)
