"""Programs calling tools through `execute`: loops, gather, errors, durability, permissions."""

from __future__ import annotations

import asyncio

import pytest

from sidecar.model.content import text_of
from sidecar.model.errors import ErrorKind
from sidecar.model.permissions import PermissionRule

from .conftest import Env, wait_until

pytestmark = pytest.mark.anyio


async def test_loop_over_tool_calls_returns_last_expression_and_prints(env: Env):
    outcome = await env.run(
        "total = 0\n"
        "for i in range(5):\n"
        "    r = await tools.calc.add(a=i, b=10)\n"
        "    total += r['sum']\n"
        "print('summed', total)\n"
        "{'total': total}\n"
    )
    assert outcome.status == "completed"
    assert outcome.output["result"] == {"total": 60}
    assert [c["call_id"] for c in outcome.output["tool_calls"]] == [f"c1/{n}" for n in range(1, 6)]
    assert "error" not in outcome.output
    assert text_of(outcome.content) == 'summed 60\nResult: {"total":60}'
    assert outcome.metadata is not None
    assert outcome.metadata["tool_calls"] == 5
    assert outcome.metadata["by_tool"]["calc_add"]["calls"] == 5


async def test_output_codec_gives_structured_value_and_content_tool_gives_text(env: Env):
    outcome = await env.run(
        "found = await tools.issues.search(query='crash', limit=2)\n"
        "body = await tools.issues.get(id=found['issues'][1]['id'])\n"
        "[found['issues'][0]['title'], body]\n"
    )
    assert outcome.output["result"] == ["crash #0", "Issue 1: body text"]


async def test_call_tool_by_effective_name_and_one_dict_argument(env: Env):
    outcome = await env.run(
        "x = await call_tool('calc_add', a=1, b=2)\n"
        "y = await tools.calc.add({'a': 3, 'b': 4})\n"
        "x['sum'] + y['sum']\n"
    )
    assert outcome.output["result"] == 10


async def test_gathered_calls_run_concurrently(env: Env):
    outcome = await env.run(
        "labels = ['a', 'b', 'c', 'd']\n"
        "await asyncio.gather(*[tools.slow(seconds=0.2, label=x) for x in labels])\n"
    )
    assert outcome.output["result"] == ["slept a", "slept b", "slept c", "slept d"]
    assert env.probe.max_inflight == 4  # all four were in flight at once
    assert len(outcome.output["tool_calls"]) == 4


async def test_concurrency_is_capped_by_the_limit(env: Env):
    from sidecar.codemode import CodeModeLimits

    outcome = await env.run(
        "await asyncio.gather(*[tools.slow(seconds=0.05) for _ in range(6)])\n",
        limits=CodeModeLimits(max_concurrent_calls=2),
    )
    assert outcome.status == "completed" and len(outcome.output["result"]) == 6
    assert env.probe.max_inflight == 2


async def test_tool_error_is_a_catchable_exception_with_kind_and_message(env: Env):
    outcome = await env.run(
        "try:\n"
        "    await tools.fail()\n"
        "except RuntimeError as e:\n"
        "    caught = str(e)\n"
        "caught\n"
    )
    assert outcome.output["result"] == "fail failed [tool_failure]: the upstream said no"
    assert outcome.output["tool_calls"][0]["error_kind"] == "tool_failure"
    assert outcome.metadata is not None and outcome.metadata["failed_calls"] == 1


async def test_uncaught_tool_error_reports_python_error_and_line(env: Env):
    outcome = await env.run("x = 1\n\nawait tools.fail()\nprint('never')\n")
    assert outcome.status == "completed"  # the program failed, the call did not
    error = outcome.output["error"]
    assert error["type"] == "RuntimeError" and error["line"] == 3
    assert "fail failed [tool_failure]" in error["message"]
    text = text_of(outcome.content)
    assert "line 3, in <module>" in text and "await tools.fail()" in text
    assert "never" not in text


async def test_invalid_nested_input_is_catchable_and_names_the_path(env: Env):
    outcome = await env.run(
        "try:\n"
        "    await tools.issues.search(query='x', state='pending')\n"
        "except RuntimeError as e:\n"
        "    message = str(e)\n"
        "message\n"
    )
    message = outcome.output["result"]
    assert message.startswith("issues_search failed [invalid_input at $.state]")
    assert "was not executed" in message
    outcome = await env.run("await tools.calc.add(a='many')", call_id="c2")
    assert "[invalid_input at $.a]" in outcome.output["error"]["message"]
    assert outcome.output["error"]["line"] == 1


async def test_positional_arguments_are_a_clear_type_error(env: Env):
    outcome = await env.run("await tools.calc.add(1, 2)")
    error = outcome.output["error"]
    assert error["type"] == "TypeError" and "keyword arguments" in error["message"]


async def test_nested_calls_are_durable_with_derived_ids_and_parent_context(env: Env):
    outcome = await env.run(
        "await tools.calc.add(a=1, b=1)\nawait tools.fail()\n", call_id="parent-7",
        session="sess-9",
    )
    assert outcome.output["error"]["type"] == "RuntimeError"
    first = await env.location.outcome("parent-7/1")
    second = await env.location.outcome("parent-7/2")
    assert first is not None and first.status == "completed" and first.tool == "calc_add"
    assert text_of(first.content) == '{"sum":2}'
    assert second is not None and second.error is not None
    assert second.error.kind is ErrorKind.TOOL_FAILURE
    stored = await env.location.outcome("parent-7")
    assert stored is not None and stored.tool == "execute"
    (seen,) = env.probe.contexts
    assert (seen.session_id, seen.agent, seen.message_id, seen.call_id) == (
        "sess-9", "agent-1", "m1", "parent-7/1"
    )


async def test_replaying_execute_returns_the_stored_outcome(env: Env):
    first = await env.run("await tools.calc.add(a=2, b=3)", call_id="again")
    second = await env.run("await tools.calc.add(a=2, b=3)", call_id="again")
    assert second.replayed and text_of(second.content) == text_of(first.content)
    assert len(env.probe.contexts) == 1


async def test_direct_only_and_unknown_tools_fail_inside_programs(env: Env):
    outcome = await env.run(
        "errors = []\n"
        "for name in ['secret', 'nope', 'execute']:\n"
        "    try:\n"
        "        await call_tool(name)\n"
        "    except RuntimeError as e:\n"
        "        errors.append(str(e))\n"
        "errors\n"
    )
    secret, nope, execute = outcome.output["result"]
    assert secret.startswith("secret failed [unavailable]")
    assert nope.startswith("nope failed [unknown_tool]")
    assert execute.startswith("execute failed [unavailable]")  # never itself reachable


async def test_nested_permission_denied_is_catchable(env: Env):
    env.location.permissions.set_location_rules([PermissionRule("guarded", "deny")])
    outcome = await env.run(
        "try:\n    await tools.guarded()\nexcept RuntimeError as e:\n    r = str(e)\nr\n"
    )
    assert outcome.output["result"].startswith("guarded failed [denied]")


async def test_nested_permission_ask_then_allow_runs_the_tool(env: Env):
    env.location.permissions.set_location_rules([PermissionRule("guarded", "ask")])
    task = asyncio.create_task(env.run("await tools.guarded()"))
    await wait_until(lambda: env.location.permissions.pending("s1"))
    (ask,) = env.location.permissions.pending("s1")
    assert ask.request.call_id == "c1/1" and ask.request.agent == "agent-1"
    await env.location.permissions.reply(ask.id, "once")
    outcome = await task
    assert outcome.output["result"] == "guarded ran"


async def test_declined_nested_call_ends_the_run_and_fails_execute_declined(env: Env):
    env.location.permissions.set_location_rules([PermissionRule("guarded", "ask")])
    task = asyncio.create_task(env.run(
        "try:\n    await tools.guarded()\nexcept RuntimeError:\n    pass\n"
        "await tools.calc.add(a=1)\n"
    ))
    await wait_until(lambda: env.location.permissions.pending("s1"))
    (ask,) = env.location.permissions.pending("s1")
    await env.location.permissions.reply(ask.id, "reject")
    outcome = await task
    assert outcome.status == "error" and outcome.error is not None
    assert outcome.error.kind is ErrorKind.DECLINED
    assert "declined" in outcome.error.message
    assert env.probe.contexts == []  # the program did not go on after the decline


async def test_syntax_error_reports_line(env: Env):
    outcome = await env.run("x = 1\ny = 1 + * 2\nz = 3\n")
    error = outcome.output["error"]
    assert error["type"] == "SyntaxError" and error["line"] == 2


async def test_runtime_error_in_a_function_shows_the_traceback(env: Env):
    outcome = await env.run(
        "def pick(items, n):\n"
        "    return items[n]\n"
        "\n"
        "pick([1, 2], 5)\n"
    )
    error = outcome.output["error"]
    assert error["type"] == "IndexError" and error["line"] == 2
    assert "line 4, in <module>" in error["traceback"]
    assert "line 2, in pick" in error["traceback"]


async def test_nothing_printed_nor_returned_still_gives_content(env: Env):
    outcome = await env.run("x = 1")
    assert outcome.output["result"] is None
    assert "printed nothing" in text_of(outcome.content)


async def test_result_values_become_json(env: Env):
    outcome = await env.run("(1, {3, 2}, b'hi', 1.5, None, float('inf'))")
    assert outcome.output["result"] == [1, [2, 3], "hi", 1.5, None, "inf"]


async def test_large_printed_text_is_bounded_by_the_seam(env: Env):
    outcome = await env.run("for i in range(4000):\n    print('line', i)\n")
    assert outcome.status == "completed" and len(outcome.managed) == 1
    text = text_of(outcome.content)
    assert "line 0" in text and "line 3999" in text and "managed_read" in text


async def test_programs_do_not_share_state(env: Env):
    await env.run("leaked = 42", call_id="c1")
    outcome = await env.run("leaked", call_id="c2")
    assert outcome.output["error"]["type"] == "NameError"
