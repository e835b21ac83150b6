"""Every step of the seam through the public API: a real Location on a temp state dir."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from pydantic import BaseModel

from sidecar import (
    AfterCall,
    BeforeCall,
    Bounds,
    ImageContent,
    Location,
    TextContent,
    Tool,
    ToolContext,
    ToolFailure,
    ToolResponse,
    ToolUnavailable,
)
from sidecar.model.errors import ErrorKind
from sidecar.stores.call_history import CallQuery

pytestmark = pytest.mark.anyio


class EchoIn(BaseModel):
    text: str
    times: int = 1


class EchoOut(BaseModel):
    echoed: str


def ctx(call_id: str = "c1", session: str = "s1") -> ToolContext:
    return ToolContext(session_id=session, agent="a", message_id="m1", call_id=call_id)


class Counter:
    def __init__(self) -> None:
        self.calls = 0


@pytest.fixture
async def location(tmp_path):
    async with Location.open(tmp_path, state_dir=tmp_path / "state") as loc:
        yield loc


def echo_tool(counter: Counter | None = None, **options: Any) -> Tool:
    async def run(args: EchoIn, context) -> EchoOut:
        if counter is not None:
            counter.calls += 1
        return EchoOut(echoed=args.text * args.times)

    return Tool(description="Echo text", input=EchoIn, output=EchoOut, execute=run, **options)


async def test_pydantic_tool_completes_with_output_and_derived_content(location):
    async with location.tools.register({"echo": echo_tool()}):
        outcome = await location.snapshot().execute("echo", {"text": "hi", "times": 2}, ctx())
    assert outcome.status == "completed"
    assert outcome.output == {"echoed": "hihi"}
    assert outcome.content == (TextContent('{"echoed":"hihi"}'),)
    assert outcome.metadata is None  # absent stays absent, never a copy of the output
    assert outcome.error is None and outcome.managed == ()


async def test_json_schema_tool_and_string_output_becomes_one_text_item(location):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}

    async def run(args, context):
        return f"n={args['n']}"

    tool = Tool(description="d", input=schema, output={"type": "string"}, execute=run)
    async with location.tools.register({"fmt": tool}):
        outcome = await location.snapshot().execute("fmt", '{"n": 3}', ctx())
    assert outcome.output == "n=3"
    assert outcome.content == (TextContent("n=3"),)


async def test_explicit_content_wins_and_metadata_is_kept(location):
    async def run(args, context):
        return ToolResponse(
            output={"echoed": "x"},
            content=[{"type": "text", "text": "shown"}, ImageContent("aGk=", "image/png")],
            metadata={"ui": {"color": "green"}},
        )

    tool = Tool(description="d", input=EchoIn, output=EchoOut, execute=run)
    async with location.tools.register({"t": tool}):
        outcome = await location.snapshot().execute("t", {"text": "x"}, ctx())
    assert outcome.content == (TextContent("shown"), ImageContent("aGk=", "image/png"))
    assert outcome.metadata == {"ui": {"color": "green"}}


async def test_invalid_input_never_executes_and_names_the_path(location):
    counter = Counter()
    async with location.tools.register({"echo": echo_tool(counter)}):
        outcome = await location.snapshot().execute("echo", {"text": "a", "times": "x"}, ctx())
    assert counter.calls == 0
    assert outcome.status == "error"
    assert outcome.error.kind is ErrorKind.INVALID_INPUT
    assert outcome.error.path == "$.times"
    assert "$.times" in outcome.error.message and "echo" in outcome.error.message


async def test_json_schema_invalid_input_names_the_nested_path(location):
    schema = {
        "type": "object",
        "properties": {"items": {"type": "array", "items": {"type": "integer"}}},
    }
    ran = Counter()

    async def run(args, context):
        ran.calls += 1
        return ToolResponse(content="ok")

    async with location.tools.register({"t": Tool(description="d", input=schema, execute=run)}):
        outcome = await location.snapshot().execute("t", {"items": [1, "two"]}, ctx())
    assert ran.calls == 0
    assert outcome.error.kind is ErrorKind.INVALID_INPUT
    assert outcome.error.path == "$.items[1]"


async def test_arguments_that_are_not_json_are_invalid_input(location):
    counter = Counter()
    async with location.tools.register({"echo": echo_tool(counter)}):
        outcome = await location.snapshot().execute("echo", '{"text": ', ctx())
    assert counter.calls == 0
    assert outcome.error.kind is ErrorKind.INVALID_INPUT
    assert "not valid JSON" in outcome.error.message


async def test_invalid_output_never_succeeds(location):
    async def run(args, context):
        return {"echoed": 42}

    tool = Tool(description="d", input=EchoIn, output=EchoOut, execute=run)
    async with location.tools.register({"t": tool}):
        outcome = await location.snapshot().execute("t", {"text": "x"}, ctx())
    assert outcome.status == "error"
    assert outcome.error.kind is ErrorKind.INVALID_OUTPUT
    assert outcome.error.path == "$.echoed"


async def test_tool_without_output_must_give_content(location):
    async def empty(args, context):
        return ToolResponse(content=[])

    async def bare(args, context):
        return "a bare value"

    tools = {
        "empty": Tool(description="d", input=EchoIn, execute=empty),
        "bare": Tool(description="d", input=EchoIn, execute=bare),
    }
    async with location.tools.register(tools):
        snap = location.snapshot()
        empty_outcome = await snap.execute("empty", {"text": "x"}, ctx("c1"))
        bare_outcome = await snap.execute("bare", {"text": "x"}, ctx("c2"))
    assert empty_outcome.error.kind is ErrorKind.INVALID_OUTPUT
    assert "no content" in empty_outcome.error.message
    assert bare_outcome.error.kind is ErrorKind.INVALID_OUTPUT
    assert "no output codec" in bare_outcome.error.message


async def test_invalid_content_items_are_invalid_output(location):
    async def run(args, context):
        return ToolResponse(content=[{"type": "video", "url": "x"}])

    async with location.tools.register({"t": Tool(description="d", input=EchoIn, execute=run)}):
        outcome = await location.snapshot().execute("t", {"text": "x"}, ctx())
    assert outcome.error.kind is ErrorKind.INVALID_OUTPUT
    assert "video" in outcome.error.message


async def test_tool_failure_is_model_visible_with_progress_and_metadata(location):
    async def run(args, context):
        context.progress({"step": 1, "of": 3})
        raise ToolFailure("disk quota of the remote is full", metadata={"remote": "r1"})

    async with location.tools.register({"t": Tool(description="d", input=EchoIn, execute=run)}):
        outcome = await location.snapshot().execute("t", {"text": "x"}, ctx())
    assert outcome.status == "error"
    assert outcome.error.kind is ErrorKind.TOOL_FAILURE
    assert outcome.error.message == "disk quota of the remote is full"
    assert outcome.partial == {"step": 1, "of": 3, "remote": "r1"}
    assert outcome.content == ()


async def test_other_exceptions_are_operational_with_an_id_in_the_log(location, caplog):
    async def run(args, context):
        raise KeyError("secret internal detail")

    caplog.set_level(logging.ERROR, logger="sidecar.execution.seam")
    async with location.tools.register({"t": Tool(description="d", input=EchoIn, execute=run)}):
        outcome = await location.snapshot().execute("t", {"text": "x"}, ctx())
    error = outcome.error
    assert error.kind is ErrorKind.OPERATIONAL and not error.kind.model_visible
    assert error.error_id and error.error_id in error.message
    assert "secret internal detail" not in error.message
    assert "Traceback" not in error.message
    records = [r for r in caplog.records if error.error_id in r.getMessage()]
    assert records and records[0].exc_info is not None
    assert "secret internal detail" in caplog.text


async def test_cancellation_propagates_and_records_nothing(location):
    started = asyncio.Event()

    async def run(args, context):
        started.set()
        await asyncio.sleep(3600)

    async with location.tools.register({"slow": Tool(description="d", input=EchoIn, execute=run)}):
        snap = location.snapshot()
        task = asyncio.create_task(snap.execute("slow", {"text": "x"}, ctx("cancel-me")))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert await location.outcome("cancel-me") is None
    assert location.seam._inflight == {}
    assert (await location.seam.store.stats()).count == 0


async def test_unknown_tool_and_final_step_fail_individually(location):
    counter = Counter()
    async with location.tools.register({"echo": echo_tool(counter)}):
        unknown = await location.snapshot().execute("nope", {}, ctx("c1"))
        final = location.snapshot(final_step=True)
        assert final.tool_choice == "none"
        assert "echo" in final.names  # definitions are kept on the final step
        blocked = await final.execute("echo", {"text": "x"}, ctx("c2"))
    assert unknown.error.kind is ErrorKind.UNKNOWN_TOOL
    assert "Unknown tool: nope" in unknown.error.message and "echo" in unknown.error.message
    assert blocked.error.kind is ErrorKind.UNAVAILABLE
    assert counter.calls == 0


async def test_snapshot_keeps_the_tool_it_captured(location):
    old, new = Counter(), Counter()
    scope = location.tools.register({"echo": echo_tool(old)})
    snap = location.snapshot()
    scope.close()
    location.tools.register({"echo": echo_tool(new)})
    await snap.execute("echo", {"text": "x"}, ctx("c1"))
    await location.snapshot().execute("echo", {"text": "x"}, ctx("c2"))
    assert (old.calls, new.calls) == (1, 1)


async def test_before_hooks_repair_then_reject(location):
    counter = Counter()

    async def repair(call: BeforeCall):
        if call.name == "ecko":
            return BeforeCall("echo", {**call.input, "times": 3}, call.context)
        return None

    async def reject(call: BeforeCall):
        if call.input.get("text") == "forbidden":
            raise ToolFailure("that text is not allowed here")
        if call.input.get("text") == "hidden":
            raise ToolUnavailable("echo is hidden in this session")
        return None

    location.hooks.before.extend([repair, reject])
    async with location.tools.register({"echo": echo_tool(counter)}):
        snap = location.snapshot()
        repaired = await snap.execute("ecko", {"text": "ab"}, ctx("c1"))
        rejected = await snap.execute("echo", {"text": "forbidden"}, ctx("c2"))
        hidden = await snap.execute("echo", {"text": "hidden"}, ctx("c3"))
    assert repaired.output == {"echoed": "ababab"} and repaired.tool == "echo"
    assert rejected.error.kind is ErrorKind.TOOL_FAILURE
    assert hidden.error.kind is ErrorKind.UNAVAILABLE
    assert counter.calls == 1


async def test_after_hook_changes_are_bounded_again(location):
    seen = []

    async def inflate(after: AfterCall):
        seen.append((after.outcome.status, after.context.call_id))
        from dataclasses import replace

        return replace(after.outcome, content=(TextContent("y" * 200_000),), metadata={"h": 1})

    location.hooks.after.append(inflate)
    async with location.tools.register({"echo": echo_tool()}):
        outcome = await location.snapshot().execute("echo", {"text": "x"}, ctx("c9"))
    assert seen == [("completed", "c9")]
    assert outcome.status == "completed" and outcome.metadata == {"h": 1}
    assert len(outcome.managed) == 1
    text = outcome.content[0].text
    assert len(text.encode()) <= 50 * 1024 and outcome.managed[0].ref in text


async def test_oversized_or_invalid_metadata_is_dropped_with_a_warning(location, caplog):
    async def big(args, context):
        return ToolResponse(content="ok", metadata={"blob": "z" * 10_000})

    async def bad(args, context):
        return ToolResponse(content="ok", metadata={"when": object()})

    tools = {
        "big": Tool(description="d", input=EchoIn, execute=big),
        "bad": Tool(description="d", input=EchoIn, execute=bad),
    }
    caplog.set_level(logging.WARNING, logger="sidecar.model.metadata")
    async with location.tools.register(tools):
        snap = location.snapshot()
        big_outcome = await snap.execute("big", {"text": "x"}, ctx("c1"))
        bad_outcome = await snap.execute("bad", {"text": "x"}, ctx("c2"))
    assert big_outcome.status == bad_outcome.status == "completed"
    assert big_outcome.metadata is None and bad_outcome.metadata is None
    assert "over the 8192 byte limit" in caplog.text and "not JSON" in caplog.text


async def test_large_text_is_bounded_retained_whole_and_readable(location):
    lines = [f"row {i:06d} " + "x" * 40 for i in range(100_000)]
    full = "\n".join(lines)

    async def run(args, context):
        return ToolResponse(content=full)

    async with location.tools.register({"dump": Tool(description="d", input=EchoIn, execute=run)}):
        snap = location.snapshot()
        outcome = await snap.execute("dump", {"text": "x"}, ctx("c1"))
        preview = outcome.content[0].text
        assert len(preview.encode()) <= 50 * 1024 and len(preview.splitlines()) <= 2000
        assert preview.startswith(lines[0]) and preview.endswith(lines[-1])
        (managed,) = outcome.managed
        assert managed.size_bytes == len(full.encode()) and managed.lines == 100_000
        read = await snap.execute(
            "managed_read", {"ref": managed.ref, "offset": 50_001, "limit": 3}, ctx("c2")
        )
        assert read.status == "completed"
        assert "\n".join(lines[50_000:50_003]) in read.content[0].text
        grep = await snap.execute(
            "managed_read", {"ref": managed.ref, "pattern": "row 077777"}, ctx("c3")
        )
        assert "77778: row 077777" in grep.content[0].text
        bad = await snap.execute("managed_read", {"ref": "../../etc/passwd"}, ctx("c4"))
        assert bad.error.kind is ErrorKind.TOOL_FAILURE
    retained = await location.seam.store.read_bytes(managed.ref, 0, managed.size_bytes)
    assert retained.text == full  # byte-identical


async def test_per_tool_bounds_override_the_location(location):
    async def run(args, context):
        return ToolResponse(content="\n".join(str(i) for i in range(100)))

    tool = Tool(description="d", input=EchoIn, execute=run, bounds=Bounds(max_lines=20))
    async with location.tools.register({"t": tool}):
        outcome = await location.snapshot().execute("t", {"text": "x"}, ctx())
    assert len(outcome.managed) == 1
    assert len(outcome.content[0].text.splitlines()) <= 20


async def test_retention_failure_fails_the_call_operationally(tmp_path):
    async def run(args, context):
        return ToolResponse(content="q" * 100_000)

    async with Location.open(
        tmp_path, state_dir=tmp_path / "state", store_quota_bytes=16
    ) as loc, loc.tools.register({"t": Tool(description="d", input=EchoIn, execute=run)}):
        outcome = await loc.snapshot().execute("t", {"text": "x"}, ctx())
        assert outcome.status == "error"
        assert outcome.error.kind is ErrorKind.OPERATIONAL
        assert outcome.content == ()  # never a lossy success
        assert (await loc.seam.store.stats()).count == 0


async def test_settled_call_id_returns_the_stored_outcome_without_executing(location):
    counter = Counter()
    async with location.tools.register({"echo": echo_tool(counter)}):
        snap = location.snapshot()
        first = await snap.execute("echo", {"text": "a"}, ctx("same"))
        again = await snap.execute("echo", {"text": "a"}, ctx("same"))
        other = await snap.execute("echo", {"text": "b"}, ctx("same"))
    assert counter.calls == 1
    assert again.replayed and not first.replayed
    assert other.error is not None and other.error.kind is ErrorKind.CONFLICT
    assert "'same'" in other.error.message
    assert again.content == first.content
    assert again.output is None  # the machine value is never stored
    stored = await location.outcome("same")
    assert stored is not None and stored.content == first.content


async def test_concurrent_duplicates_execute_once(location):
    counter = Counter()
    gate = asyncio.Event()

    async def run(args, context):
        counter.calls += 1
        await gate.wait()
        return ToolResponse(content="done")

    async with location.tools.register({"t": Tool(description="d", input=EchoIn, execute=run)}):
        snap = location.snapshot()
        calls = [snap.execute("t", {"text": "x"}, ctx("dup")) for _ in range(5)]
        tasks = [asyncio.create_task(call) for call in calls]
        await asyncio.sleep(0.05)
        gate.set()
        outcomes = await asyncio.gather(*tasks)
    assert counter.calls == 1
    assert {o.content for o in outcomes} == {(TextContent("done"),)}


async def test_errors_are_durable_too(location):
    async with location.tools.register({"echo": echo_tool()}):
        await location.snapshot().execute("echo", {"text": 5}, ctx("bad-input"))
    stored = await location.outcome("bad-input")
    assert stored.status == "error" and stored.error.kind is ErrorKind.INVALID_INPUT


async def test_progress_is_published_as_events(location):
    async def run(args, context):
        context.progress({"done": 1})
        context.progress({"done": 2, "huge": "x" * 20_000})  # over the bound: not published
        return ToolResponse(content="ok")

    async with location.tools.register({"t": Tool(description="d", input=EchoIn, execute=run)}):
        snap = location.snapshot()
        async with location.events.subscribe() as sub:
            await snap.execute("t", {"text": "x"}, ctx("p1"))
            first = await sub.next()
            settled = await sub.next()
    assert first.snapshot == {"done": 1} and first.call_id == "p1"
    assert settled.status == "completed"


async def test_registration_is_validated_whole(location):
    async def run(args, context):
        return ToolResponse(content="ok")

    good = Tool(description="d", input=EchoIn, execute=run)
    bad = Tool(description="d", input={"type": "string"}, execute=run)
    from sidecar.model.errors import RegistrationError

    with pytest.raises(RegistrationError, match="'bad'"):
        location.tools.register({"good": good, "bad": bad})
    assert "good" not in location.snapshot().names


async def test_in_flight_duplicates_without_an_outcome_log(tmp_path):
    """Not durable: the in-flight map alone makes a duplicate wait for the first call and
    refuses another call under the same id (its fingerprint is computed only then)."""
    counter = Counter()
    gate = asyncio.Event()

    async def run(args, context):
        counter.calls += 1
        await gate.wait()
        return ToolResponse(content=f"done {args.text}")

    tool = Tool(description="d", input=EchoIn, execute=run)
    async with Location.open(tmp_path, state_dir=tmp_path / "state", durable=False) as loc:
        async with loc.tools.register({"t": tool}):
            snap = loc.snapshot()
            first = asyncio.create_task(snap.execute("t", {"text": "x"}, ctx("dup")))
            await asyncio.sleep(0.01)
            same = asyncio.create_task(snap.execute("t", '{"text": "x"}', ctx("dup")))
            other = await snap.execute("t", {"text": "y"}, ctx("dup"))
            gate.set()
            outcomes = await asyncio.gather(first, same)
            after = await snap.execute("t", {"text": "y"}, ctx("dup"))  # nothing kept: runs
    assert other.error is not None and other.error.kind is ErrorKind.CONFLICT
    assert [o.content for o in outcomes] == [(TextContent("done x"),)] * 2
    assert after.status == "completed" and counter.calls == 2


async def test_call_rows_are_built_only_while_someone_wants_them(tmp_path):
    """Not durable (no history): the seam hands no call to the history hook until a call
    listener is added, and stops again once it is removed."""
    rows = []
    async with Location.open(tmp_path, state_dir=tmp_path / "state", durable=False) as loc:
        async with loc.tools.register({"echo": echo_tool()}):
            snap = loc.snapshot()
            assert loc.seam.audit is None
            await snap.execute("echo", {"text": "unseen"}, ctx("c0"))
            loc.call_listeners.append(rows.append)
            await snap.execute("echo", {"text": "seen", "api_key": "k"}, ctx("c1"))
            loc.call_listeners.remove(rows.append)
            assert loc.seam.audit is None
            await snap.execute("echo", {"text": "unseen"}, ctx("c2"))
    assert [(r.call_id, r.input) for r in rows] == [("c1", {"text": "seen", "api_key": "***"})]
    assert rows[0].input_bytes == len('{"text":"seen","api_key":"k"}')


async def test_a_durable_location_records_every_call(location):
    async with location.tools.register({"echo": echo_tool()}):
        assert location.seam.audit is not None
        await location.snapshot().execute("echo", {"text": "kept"}, ctx("h1"))
    history = location.stores.history
    assert history is not None
    rows, _ = await history.query(CallQuery())
    assert [(r.call_id, r.input, r.status) for r in rows] == [("h1", {"text": "kept"},
                                                              "completed")]
