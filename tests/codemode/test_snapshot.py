"""What a request advertises in each Code Mode setting, and the stable built-ins."""

from __future__ import annotations

import logging

import pytest

from sidecar import Tool, ToolResponse
from sidecar.codemode import (
    EXECUTE_DESCRIPTION,
    CodeModeLimits,
    codemode_snapshot,
)
from sidecar.model.content import text_of
from sidecar.model.errors import ErrorKind

from .conftest import Env, ctx

pytestmark = pytest.mark.anyio

REACHABLE = {"calc_add", "issues_search", "issues_get", "fail", "slow", "guarded",
             "managed_read"}
BUILTINS = {"execute", "search_tools", "describe_tools"}


async def test_direct_mode_advertises_the_entries_as_they_are(env: Env):
    snapshot = env.snapshot(mode="direct")
    assert set(snapshot.names) == REACHABLE | {"secret"}


async def test_codemode_advertises_direct_only_tools_and_the_builtins(env: Env):
    snapshot = env.snapshot(mode="codemode")
    assert set(snapshot.names) == BUILTINS | {"secret"}
    outcome = await snapshot.execute("secret", {}, ctx("d1"))
    assert text_of(outcome.content) == "direct only"
    outcome = await snapshot.execute("calc_add", {"a": 1}, ctx("d2"))
    assert outcome.error is not None and outcome.error.kind is ErrorKind.UNAVAILABLE


async def test_both_advertises_everything(env: Env):
    snapshot = env.snapshot(mode="both")
    assert set(snapshot.names) == REACHABLE | {"secret"} | BUILTINS
    direct = await snapshot.execute("calc_add", {"a": 1, "b": 2}, ctx("d1"))
    assert direct.output == {"sum": 3}
    program = await snapshot.execute("execute", {"code": "await tools.calc.add(a=2)"}, ctx("d2"))
    assert program.output["result"] == {"sum": 2}


async def test_builtins_are_stable_across_catalogs(env: Env):
    before = {d.name: d for d in env.snapshot().definitions}

    async def extra(args, context):
        return ToolResponse(content="x")

    tool = Tool(description="A new tool.", input={"type": "object"}, execute=extra)
    async with env.location.tools.register({"brand_new": tool}, namespace="later"):
        after = {d.name: d for d in env.snapshot().definitions}
    for name in BUILTINS:
        assert before[name] == after[name]
    assert before["execute"].description == EXECUTE_DESCRIPTION
    assert "brand_new" not in EXECUTE_DESCRIPTION
    assert before["execute"].input_schema["required"] == ["code"]


async def test_execute_description_documents_the_calling_convention():
    for phrase in ("await tools.<namespace>.<tool>(", "call_tool(", "asyncio.gather",
                   "RuntimeError", "search_tools", "describe_tools", "last expression"):
        assert phrase in EXECUTE_DESCRIPTION


async def test_registry_changes_after_the_snapshot_do_not_reach_programs(env: Env):
    snapshot = env.snapshot()

    async def late(args, context):
        return ToolResponse(content="late")

    tool = Tool(description="Late.", input={"type": "object"}, execute=late)
    async with env.location.tools.register({"late": tool}):
        outcome = await snapshot.execute(
            "execute", {"code": "await call_tool('late')"}, ctx("c1")
        )
        fresh = await env.snapshot().execute(
            "execute", {"code": "await tools.late()"}, ctx("c2")
        )
    assert "late failed [unknown_tool]" in outcome.output["error"]["message"]
    assert fresh.output["result"] == "late"


async def test_final_step_keeps_definitions_but_refuses_execute(env: Env):
    snapshot = env.snapshot(final_step=True)
    assert snapshot.tool_choice == "none" and "execute" in snapshot.names
    outcome = await snapshot.execute("execute", {"code": "1"}, ctx())
    assert outcome.error is not None and outcome.error.kind is ErrorKind.UNAVAILABLE


async def test_removed_tools_stay_unavailable_inside_programs(env: Env):
    entries = {n: e for n, e in env.location.registry.effective().items() if n != "slow"}
    snapshot = codemode_snapshot(env.location.seam, entries, sandbox=env.sandbox,
                                 removed={"slow"})
    outcome = await snapshot.execute(
        "execute", {"code": "await tools.slow(seconds=0)"}, ctx()
    )
    assert outcome.output["error"]["type"] == "AttributeError"
    outcome = await snapshot.execute(
        "execute", {"code": "await call_tool('slow', seconds=0)"}, ctx("c2")
    )
    assert "slow failed [unavailable]" in outcome.output["error"]["message"]


async def test_a_tool_named_like_a_builtin_is_left_out_and_reported(env: Env, caplog):
    async def fake(args, context):
        return ToolResponse(content="user execute")

    tool = Tool(description="User tool.", input={"type": "object"}, execute=fake)
    with caplog.at_level(logging.WARNING, logger="sidecar.registry.registry"):
        scope = env.location.tools.register({"execute": tool}, label="user")
    async with scope:
        snapshot = env.snapshot(mode="both")
        outcome = await snapshot.execute(
            "execute", {"code": "await call_tool('execute')"}, ctx()
        )
        conflicts = (await env.location.health())["reserved_name_conflicts"]
    assert "sidecar built-in" in caplog.text
    assert [c["tool"] for c in conflicts] == ["execute"]
    assert outcome.output["result"] is None  # the program's call found no user tool
    assert "execute failed [unavailable]" in str(outcome.output)  # the built-in itself


async def test_invalid_settings(env: Env):
    with pytest.raises(ValueError, match="needs a Sandbox"):
        codemode_snapshot(env.location.seam, {}, mode="codemode")
    with pytest.raises(ValueError, match="unknown Code Mode setting"):
        codemode_snapshot(env.location.seam, {}, mode="sometimes", sandbox=env.sandbox)  # type: ignore[arg-type]
    assert codemode_snapshot(env.location.seam, {}, mode="direct").names == ()


async def test_execute_input_is_validated_by_the_seam(env: Env):
    snapshot = env.snapshot(limits=CodeModeLimits())
    outcome = await snapshot.execute("execute", {"program": "1"}, ctx())
    assert outcome.error is not None and outcome.error.kind is ErrorKind.INVALID_INPUT
