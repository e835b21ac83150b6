"""`behind.answer_first`: inside it the seam leaves a call's history row and metrics until the
block ends, however it ends; outside it (and in tasks that outlive it) nothing changes."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from sidecar import Location, Tool, ToolContext
from sidecar.execution import behind
from sidecar.execution.behind import answer_first
from sidecar.model.outcome import Outcome
from sidecar.stores.call_history import CallQuery, SettledCall

pytestmark = pytest.mark.anyio

SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}}


def ctx(call_id: str) -> ToolContext:
    return ToolContext(session_id="s1", agent="a", message_id="m1", call_id=call_id)


@dataclass
class Recorded:
    """A Location whose seam also notes each history row and each metrics observation."""

    location: Location
    rows: list[SettledCall] = field(default_factory=list)
    observed: list[str] = field(default_factory=list)

    async def call(self, call_id: str, text: str = "hi") -> Outcome:
        return await self.location.snapshot().execute("echo", {"text": text}, ctx(call_id))

    def row_ids(self) -> list[str]:
        return [row.outcome.call_id for row in self.rows]


@pytest.fixture
async def recorded(tmp_path):
    async with Location.open(tmp_path, state_dir=tmp_path / "state") as loc:
        seen = Recorded(loc)
        audit = loc.seam.audit
        assert audit is not None  # the history is on by default

        def noted(call: SettledCall) -> None:
            seen.rows.append(call)
            audit(call)

        loc.seam.audit = noted
        loc.seam.observers.append(lambda outcome, took: seen.observed.append(outcome.call_id))

        async def echo(args: Any, context: Any) -> str:
            return str(args.get("text", ""))

        tool = Tool(description="echo", input=SCHEMA, output={"type": "string"}, execute=echo)
        async with loc.tools.register({"echo": tool}):
            yield seen


async def test_outside_a_block_the_row_and_the_metrics_come_before_the_outcome(recorded):
    outcome = await recorded.call("c1")
    assert outcome.status == "completed"
    assert recorded.row_ids() == ["c1"]
    assert recorded.observed == ["c1"]


async def test_inside_a_block_they_wait_for_its_end_and_record_the_settled_values(recorded):
    with answer_first():
        began = time.perf_counter()
        outcome = await recorded.call("c1")
        took = time.perf_counter() - began
        await asyncio.sleep(0.05)  # time passes before the answer is written
        assert outcome.status == "completed"
        assert recorded.rows == [] and recorded.observed == []
    (row,) = recorded.rows
    assert row.outcome is outcome and row.duration <= took  # taken when the call settled
    assert recorded.observed == ["c1"]
    history = recorded.location.stores.history
    assert history is not None
    await history.flush()
    found_rows, _ = await history.query(CallQuery(limit=10))
    (found,) = found_rows
    assert found.call_id == "c1" and found.status == "completed"


async def test_a_block_that_fails_or_is_cancelled_still_records(recorded):
    with pytest.raises(ConnectionResetError), answer_first():
        await recorded.call("c1", "a")
        raise ConnectionResetError("the client is gone")

    async def answered_then_cancelled() -> None:
        with answer_first():
            await recorded.call("c2", "b")
            await asyncio.Event().wait()  # the answer's write never ends

    task = asyncio.create_task(answered_then_cancelled())
    await asyncio.sleep(0.05)
    assert recorded.row_ids() == ["c1"]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert recorded.row_ids() == ["c1", "c2"]
    assert recorded.observed == ["c1", "c2"]


async def test_a_task_that_outlives_the_block_records_at_once(recorded):
    go = asyncio.Event()

    async def later_call() -> None:
        await go.wait()
        await recorded.call("late", "late")

    with answer_first():
        task = asyncio.create_task(later_call())  # it inherits the block's queue
        await asyncio.sleep(0)
    go.set()
    await task
    assert recorded.row_ids() == ["late"]
    assert behind.later() is None


async def test_a_job_that_raises_is_logged_and_the_rest_still_run(recorded, caplog):
    def broken(call: SettledCall) -> None:
        raise RuntimeError("history broke")

    recorded.location.seam.audit = broken
    with caplog.at_level(logging.ERROR, logger="sidecar.execution"), answer_first():
        outcome = await recorded.call("c1", "a")
    assert outcome.status == "completed"
    assert recorded.observed == ["c1"]  # queued before the broken job ran
    assert "history row or metrics failed" in caplog.text
    assert "history broke" in caplog.text
