"""`behind.answer_first`: inside it the seam leaves a call's history row and metrics until the
block ends, however it ends; outside it (and in tasks that outlive it) nothing changes."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from sidecar import Location, Tool, ToolContext
from sidecar.execution import behind
from sidecar.execution.behind import answer_first
from sidecar.stores.call_history import CallQuery, SettledCall

pytestmark = pytest.mark.anyio

SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}}


def ctx(call_id: str) -> ToolContext:
    return ToolContext(session_id="s1", agent="a", message_id="m1", call_id=call_id)


@pytest.fixture
async def location(tmp_path):
    async with Location.open(tmp_path, state_dir=tmp_path / "state") as loc:
        rows: list[SettledCall] = []
        observed: list[str] = []
        audit = loc.seam.audit
        assert audit is not None  # the history is on by default

        def recorded(call: SettledCall) -> None:
            rows.append(call)
            audit(call)

        loc.seam.audit = recorded
        loc.seam.observers.append(lambda outcome, took: observed.append(outcome.call_id))

        async def echo(args: Any, context: Any) -> str:
            return str(args.get("text", ""))

        tool = Tool(description="echo", input=SCHEMA, output={"type": "string"}, execute=echo)
        async with loc.tools.register({"echo": tool}):
            loc.test_rows, loc.test_observed = rows, observed  # type: ignore[attr-defined]
            yield loc


async def test_outside_a_block_the_row_and_the_metrics_come_before_the_outcome(location):
    outcome = await location.snapshot().execute("echo", {"text": "hi"}, ctx("c1"))
    assert outcome.status == "completed"
    assert [r.outcome.call_id for r in location.test_rows] == ["c1"]
    assert location.test_observed == ["c1"]


async def test_inside_a_block_they_wait_for_its_end_and_record_the_settled_values(location):
    with answer_first():
        outcome = await location.snapshot().execute("echo", {"text": "hi"}, ctx("c1"))
        await asyncio.sleep(0.01)  # time passes before the answer is written
        assert outcome.status == "completed"
        assert location.test_rows == [] and location.test_observed == []
    (row,) = location.test_rows
    assert row.outcome is outcome and row.duration < 0.01  # taken when the call settled
    assert location.test_observed == ["c1"]
    history = location.stores.history
    assert history is not None
    await history.flush()
    found_rows, _ = await history.query(CallQuery(limit=10))
    (found,) = found_rows
    assert found.call_id == "c1" and found.status == "completed"


async def test_a_block_that_fails_or_is_cancelled_still_records(location):
    with pytest.raises(ConnectionResetError), answer_first():
        await location.snapshot().execute("echo", {"text": "a"}, ctx("c1"))
        raise ConnectionResetError("the client is gone")

    async def answered_then_cancelled() -> None:
        with answer_first():
            await location.snapshot().execute("echo", {"text": "b"}, ctx("c2"))
            await asyncio.Event().wait()  # the answer's write never ends

    task = asyncio.create_task(answered_then_cancelled())
    await asyncio.sleep(0.05)
    assert [r.outcome.call_id for r in location.test_rows] == ["c1"]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [r.outcome.call_id for r in location.test_rows] == ["c1", "c2"]
    assert location.test_observed == ["c1", "c2"]


async def test_a_task_that_outlives_the_block_records_at_once(location):
    go = asyncio.Event()

    async def later_call() -> None:
        await go.wait()
        await location.snapshot().execute("echo", {"text": "late"}, ctx("late"))

    with answer_first():
        task = asyncio.create_task(later_call())  # it inherits the block's queue
        await asyncio.sleep(0)
    go.set()
    await task
    assert [r.outcome.call_id for r in location.test_rows] == ["late"]
    assert behind.later() is None


async def test_a_job_that_raises_is_logged_and_the_rest_still_run(location, caplog):
    def broken(call: SettledCall) -> None:
        raise RuntimeError("history broke")

    location.seam.audit = broken
    with caplog.at_level(logging.ERROR, logger="sidecar.execution"), answer_first():
        outcome = await location.snapshot().execute("echo", {"text": "a"}, ctx("c1"))
    assert outcome.status == "completed"
    assert location.test_observed == ["c1"]  # queued before the broken job ran
    assert "history row or metrics failed" in caplog.text
    assert "history broke" in caplog.text
