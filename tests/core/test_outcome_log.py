"""The outcome log's settled-call filter: never a false negative, also after a restart."""

from __future__ import annotations

import pytest

from sidecar.content import TextContent
from sidecar.outcome import Outcome
from sidecar.outcome_log import SettledFilter, SqliteOutcomeLog
from sidecar.tool import ToolContext

pytestmark = pytest.mark.anyio


def test_filter_has_no_false_negatives_and_few_false_positives():
    f = SettledFilter(bits=1 << 16)
    added = [f"call-{i}" for i in range(2000)]
    for call_id in added:
        f.add("loc", call_id)
    assert all(f.may_contain("loc", c) for c in added)
    false_positives = sum(f.may_contain("loc", f"other-{i}") for i in range(5000))
    assert false_positives < 250  # about 0.2 % expected at this load; a broken hash gives ~all


async def test_settled_calls_are_found_after_reopening(tmp_path):
    path = tmp_path / "outcomes.sqlite"
    log = await SqliteOutcomeLog.open(path)
    outcome = Outcome(call_id="c1", tool="t", status="completed", content=(TextContent("x"),))
    await log.record("loc", outcome, ToolContext("s", "a", "m", "c1"))
    assert (await log.get("loc", "c1")).content == (TextContent("x"),)
    assert await log.get("loc", "never") is None
    await log.aclose()
    reopened = await SqliteOutcomeLog.open(path)
    try:
        again = await reopened.get("loc", "c1")
        assert again is not None and again.replayed
        assert await reopened.get("other-location", "c1") is None
    finally:
        await reopened.aclose()
