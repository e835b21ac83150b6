"""Precedence, reveal-on-close, application vs Location registrations, snapshot capture."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import BaseModel

from sidecar import Location, Tool, ToolContext, ToolResponse
from sidecar.execution.snapshot import SnapshotExpired, SnapshotStore
from sidecar.model.errors import ErrorKind, RegistrationError
from sidecar.registry.registry import Registry, Tools, application_registry

pytestmark = pytest.mark.anyio


class In(BaseModel):
    pass


def tagged(tag: str) -> Tool:
    async def run(args, ctx):
        return ToolResponse(content=tag)

    return Tool(description=f"tool {tag}", input=In, execute=run)


def ctx(call_id: str) -> ToolContext:
    return ToolContext("s", "a", "m", call_id)


def winner(registry: Registry, name: str) -> str:
    return registry.effective()[name].tool.description


def test_latest_active_registration_wins_and_closing_reveals_the_next():
    registry = Registry()
    tools = Tools(registry)
    a = tools.register({"x": tagged("a")})
    b = tools.register({"x": tagged("b"), "y": tagged("b")})
    c = tools.register({"x": tagged("c")})
    assert winner(registry, "x") == "tool c" and winner(registry, "y") == "tool b"
    b.close()  # closing a non-winner changes nothing for x, removes y
    assert winner(registry, "x") == "tool c" and "y" not in registry.effective()
    c.close()
    assert winner(registry, "x") == "tool a"
    a.close()
    assert "x" not in registry.effective()
    a.close()  # closing twice is harmless


def test_replace_in_place_keeps_precedence():
    registry = Registry()
    tools = Tools(registry)
    source = tools.register({"x": tagged("v1")})
    tools.register({"x": tagged("later")})
    source.replace({"x": tagged("v2"), "z": tagged("v2")})
    assert winner(registry, "x") == "tool later"  # the source did not move to the end
    assert winner(registry, "z") == "tool v2"


def test_mutating_the_callers_mapping_changes_nothing():
    registry = Registry()
    mapping = {"x": tagged("a")}
    Tools(registry).register(mapping)
    mapping["x"] = tagged("b")
    mapping["y"] = tagged("b")
    assert winner(registry, "x") == "tool a" and "y" not in registry.effective()


def test_invalid_registration_is_rejected_whole_and_keeps_previous_definitions():
    registry = Registry()
    tools = Tools(registry)
    tools.register({"x": tagged("good")})
    with pytest.raises(RegistrationError, match=r"'a\.b' and 'a_b' both become 'a_b'"):
        tools.register({"x": tagged("new"), "a.b": tagged("1"), "a_b": tagged("2")})
    with pytest.raises(RegistrationError, match="expected a Tool"):
        tools.register({"x": tagged("new"), "bad": object()})  # type: ignore[dict-item]
    assert winner(registry, "x") == "tool good" and set(registry.effective()) == {"x"}
    scope = tools.register({"y": tagged("y")})
    with pytest.raises(RegistrationError):
        scope.replace({"y": tagged("y2"), "": tagged("empty")})
    assert winner(registry, "y") == "tool y"


async def test_location_registrations_win_over_application_ones(tmp_path):
    app_tools = Tools(application_registry)
    app_scope = app_tools.register({"shared": tagged("app"), "only_app": tagged("app")})
    try:
        async with Location.open(tmp_path, state_dir=tmp_path / "s") as loc:
            assert "only_app" in loc.snapshot().names
            assert loc.snapshot().entry("shared").tool.description == "tool app"
            async with loc.tools.register({"shared": tagged("loc")}):
                assert loc.snapshot().entry("shared").tool.description == "tool loc"
            assert loc.snapshot().entry("shared").tool.description == "tool app"
    finally:
        app_scope.close()


async def test_snapshot_capture_under_concurrent_registration_changes(tmp_path):
    async with Location.open(tmp_path, state_dir=tmp_path / "s") as loc:
        stop = asyncio.Event()

        async def churn():
            # A change about every millisecond. A busy loop (sleep(0)) starved the outcome
            # log's thread of the GIL: 50 calls took minutes on a slow machine.
            i = 0
            while not stop.is_set():
                scope = loc.tools.register({"x": tagged(f"churn{i}")})
                await asyncio.sleep(0.0005)
                scope.close()
                await asyncio.sleep(0.0005)
                i += 1

        base = loc.tools.register({"x": tagged("base")})
        task = asyncio.create_task(churn())
        try:
            for i in range(50):
                snap = loc.snapshot()
                captured = snap.entry("x").tool.description
                # The churn may or may not change `x` in between (timing); this change surely
                # does: whichever registration is newest now, it is not the captured one.
                async with loc.tools.register({"x": tagged(f"during{i}")}):
                    await asyncio.sleep(0.002)  # the churn runs under us too
                    assert loc.snapshot().entry("x").tool.description != captured
                    outcome = await snap.execute("x", {}, ctx(f"cc{i}"))
                assert outcome.content[0].text == captured.removeprefix("tool ")
        finally:
            stop.set()
            await task
            base.close()


async def test_definitions_are_sorted_and_snapshot_options(tmp_path):
    async with Location.open(tmp_path, state_dir=tmp_path / "s") as loc:
        loc.tools.register({"zeta": tagged("z"), "alpha": tagged("a"), "mid": tagged("m")})
        snap = loc.snapshot()
        assert list(snap.names) == sorted(snap.names)
        only = loc.snapshot(allow=["a*", "mi*"], deny=["mid"])
        assert only.names == ("alpha",)
        denied = await only.execute("zeta", {}, ctx("c1"))
        assert denied.error.kind is ErrorKind.UNAVAILABLE

        def hide_mid(session_id, definitions):
            return ["mid"] if session_id == "s-hidden" else []

        loc.hooks.definitions.append(hide_mid)
        hidden = loc.snapshot(session_id="s-hidden")
        assert "mid" not in hidden.names and "mid" in loc.snapshot(session_id="other").names
        removed = await hidden.execute("mid", {}, ctx("c2"))
        assert removed.error.kind is ErrorKind.UNAVAILABLE
        assert "not available for this request" in removed.error.message
        unknown = await hidden.execute("nothing", {}, ctx("c3"))
        assert unknown.error.kind is ErrorKind.UNKNOWN_TOOL


async def test_a_snapshot_not_kept_is_not_addressable(tmp_path):
    async with Location.open(tmp_path, state_dir=tmp_path / "s") as loc:
        loc.tools.register({"t": tagged("t")})
        loose = loc.snapshot(keep=False)
        assert [d.name for d in loose.definitions] == ["managed_read", "t"]
        assert len(loc.snapshots) == 0
        with pytest.raises(SnapshotExpired, match=loose.id):
            loc.snapshots.get(loose.id)


async def test_snapshots_are_addressable_by_id_with_ttl_and_count(tmp_path):
    async with Location.open(tmp_path, state_dir=tmp_path / "s") as loc:
        snap = loc.snapshot()
        assert loc.snapshots.get(snap.id) is snap
    store = SnapshotStore(ttl_seconds=3600, max_count=2)
    async with Location.open(tmp_path, state_dir=tmp_path / "s2") as loc:
        first, second, third = (store.add(loc.snapshot()) for _ in range(3))
        with pytest.raises(SnapshotExpired, match=first.id):
            store.get(first.id)
        assert store.get(third.id) is third and store.get(second.id) is second
        short = SnapshotStore(ttl_seconds=0.01)
        old = short.add(loc.snapshot())
        await asyncio.sleep(0.03)
        with pytest.raises(SnapshotExpired):
            short.get(old.id)
