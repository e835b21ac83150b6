"""Permission rules, asks, replies, timeouts, cascades and persistence of `always`."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import BaseModel

from sidecar import Location, Tool, ToolContext, ToolResponse
from sidecar.backends.sqlite.permissions import SqlitePermissionStore
from sidecar.model.errors import ErrorKind, ToolFailure
from sidecar.model.events import PermissionAsked
from sidecar.model.permissions import PermissionRequest, PermissionRule, decide
from sidecar.policy.permission_service import PermissionService, UnknownAsk

pytestmark = pytest.mark.anyio


def req(action: str, session: str = "s1", resources=(), default=None) -> PermissionRequest:
    return PermissionRequest(session_id=session, agent="a", action=action,
                             resources=tuple(resources), default=default, call_id="c")


def test_rule_matching_last_match_wins_and_layers_override():
    daemon = [PermissionRule("*", "allow"), PermissionRule("git_*", "ask")]
    location = [PermissionRule("git_status", "allow")]
    session = [PermissionRule("git_status", "deny")]
    assert decide([daemon], "git_commit", ()) == "ask"
    assert decide([daemon, location], "git_status", ()) == "allow"
    assert decide([daemon, location, session], "git_status", ()) == "deny"
    assert decide([[]], "anything", ()) is None
    files = [PermissionRule("fs_write", "allow", resource="/work/*")]
    assert decide([files], "fs_write", ("/work/a.txt",)) == "allow"
    assert decide([files], "fs_write", ("/etc/passwd",)) is None
    assert decide([files], "fs_write", ("/work/a", "/etc/b")) is None  # every resource must match


async def test_allow_deny_and_default_from_the_request():
    service = await PermissionService.open(
        None, defaults=[PermissionRule("rm_*", "deny"), PermissionRule("safe", "allow")]
    )
    try:
        await service.ask(req("safe"))
        await service.ask(req("unlisted"))  # no rule, no default: allow
        with pytest.raises(ToolFailure) as err:
            await service.ask(req("rm_rf"))
        assert err.value.kind is ErrorKind.DENIED
        with pytest.raises(ToolFailure) as err:
            await service.ask(req("other", default="deny"))
        assert err.value.kind is ErrorKind.DENIED
    finally:
        await service.aclose()


async def ask_in_background(service, request):
    task = asyncio.create_task(service.ask(request))
    for _ in range(500):  # an ask reads the store first (a worker thread, or a database)
        await asyncio.sleep(0.01)
        if [p for p in service.pending() if p.request is request]:
            return task, next(p for p in service.pending() if p.request is request)
    raise AssertionError("the ask never became pending")


async def test_ask_once_always_reject_and_cascade(tmp_path):
    store = await SqlitePermissionStore.open(tmp_path / "p.sqlite")
    service = await PermissionService.open(store, defaults=[PermissionRule("*", "ask")])
    try:
        task, pending = await ask_in_background(service, req("deploy"))
        await service.reply(pending.id, "once")
        await task
        task, pending = await ask_in_background(service, req("deploy"))  # once: asks again
        # two more pending in the same session and one in another
        t2, _ = await ask_in_background(service, req("deploy"))
        t3, p3 = await ask_in_background(service, req("migrate"))
        t4, p4 = await ask_in_background(service, req("migrate", session="s2"))
        await service.reply(pending.id, "always")
        await task
        await t2  # released: the new always rule covers it
        assert not t3.done()
        await service.reply(p3.id, "reject")  # no feedback: declined
        with pytest.raises(ToolFailure) as err:
            await t3
        assert err.value.kind is ErrorKind.DECLINED
        assert not t4.done()  # another session is not affected
        await service.reply(p4.id, "reject", feedback="use the staging database instead")
        with pytest.raises(ToolFailure) as err:
            await t4
        assert err.value.kind is ErrorKind.TOOL_FAILURE
        assert "staging database" in err.value.message
        with pytest.raises(UnknownAsk):
            await service.reply(p4.id, "once")
    finally:
        await service.aclose()
        await store.aclose()


async def test_rejecting_one_request_rejects_the_sessions_other_pending_ones():
    service = await PermissionService.open(None, defaults=[PermissionRule("*", "ask")])
    try:
        t1, p1 = await ask_in_background(service, req("a"))
        t2, _ = await ask_in_background(service, req("b"))
        t3, p3 = await ask_in_background(service, req("c", session="other"))
        await service.reply(p1.id, "reject", feedback="no")
        with pytest.raises(ToolFailure):
            await t1
        with pytest.raises(ToolFailure) as err:
            await t2
        assert err.value.kind is ErrorKind.DECLINED
        assert not t3.done()
        await service.reply(p3.id, "once")
        await t3
    finally:
        await service.aclose()


async def test_ask_timeout_declines():
    service = await PermissionService.open(
        None, defaults=[PermissionRule("*", "ask")], ask_timeout=0.05
    )
    try:
        with pytest.raises(ToolFailure) as err:
            await service.ask(req("slow"))
        assert err.value.kind is ErrorKind.DECLINED and "within" in err.value.message
        assert service.pending() == []
    finally:
        await service.aclose()


async def test_cancelled_ask_leaves_nothing_pending():
    service = await PermissionService.open(None, defaults=[PermissionRule("*", "ask")])
    try:
        task, _ = await ask_in_background(service, req("x"))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert service.pending() == []
    finally:
        await service.aclose()


async def test_always_survives_a_restart(tmp_path):
    path = tmp_path / "p.sqlite"
    store = await SqlitePermissionStore.open(path)
    service = await PermissionService.open(store, defaults=[PermissionRule("*", "ask")])
    task, pending = await ask_in_background(service, req("deploy", session="s1"))
    await service.reply(pending.id, "always")
    await task
    t2, p2 = await ask_in_background(service, req("publish", session="s1"))
    await service.reply(p2.id, "always", scope="location")
    await t2
    await service.aclose()
    await store.aclose()
    store = await SqlitePermissionStore.open(path)
    service = await PermissionService.open(store, defaults=[PermissionRule("*", "ask")])
    try:
        await asyncio.wait_for(service.ask(req("deploy", session="s1")), 1)
        await asyncio.wait_for(service.ask(req("publish", session="s9")), 1)  # location-wide
        task, pending = await ask_in_background(service, req("deploy", session="s2"))
        await service.reply(pending.id, "once")  # a session rule does not leak to others
        await task
    finally:
        await service.aclose()
        await store.aclose()


class In(BaseModel):
    target: str


async def test_a_trusted_tool_asks_and_manifest_rules_apply(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "rules.toml").write_text(
        '[[permissions.rules]]\naction = "deploy"\ndecision = "ask"\n'
        '[[permissions.rules]]\naction = "nuke"\ndecision = "deny"\n'
    )
    async with Location.open(tmp_path, state_dir=tmp_path / "s", manifests=[tmp_path / "m"]) as loc:
        gate = loc.permissions

        def trusted(action: str) -> Tool:
            async def run(args: In, ctx):
                await gate.ask(PermissionRequest(
                    session_id=ctx.session_id, agent=ctx.agent, message_id=ctx.message_id,
                    call_id=ctx.call_id, action=action, resources=(args.target,),
                ))
                return ToolResponse(content=f"{action} {args.target} done")

            return Tool(description=action, input=In, execute=run)

        loc.tools.register({"deploy": trusted("deploy"), "nuke": trusted("nuke")})
        snap = loc.snapshot(session_id="s1")
        assert "nuke" not in snap.names  # denied outright: hidden from the catalog
        async with loc.events.subscribe() as sub:
            call = asyncio.create_task(
                snap.execute("deploy", {"target": "prod"}, ToolContext("s1", "a", "m", "c1"))
            )
            asked = await sub.next()
            while not isinstance(asked, PermissionAsked):
                asked = await sub.next()
            assert asked.ask["action"] == "deploy" and asked.ask["resources"] == ["prod"]
            assert asked.ask["source"] == {"message_id": "m", "call_id": "c1"}
            await loc.permissions.reply(asked.ask["id"], "reject")
            outcome = await call
        assert outcome.error.kind is ErrorKind.DECLINED
        visible = loc.snapshot(session_id="s1", hide_denied=False)
        nuked = await visible.execute("nuke", {"target": "x"}, ToolContext("s1", "a", "m", "c2"))
        assert nuked.error.kind is ErrorKind.DENIED
