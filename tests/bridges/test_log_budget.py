"""`LogBudget`: a burst, then `RATE` lines per second; what is dropped is summarised."""

from __future__ import annotations

import logging

import pytest

from bridges.mcp.log_budget import BURST, RATE, SUMMARY_EVERY, LogBudget


def test_a_burst_then_the_rate_and_one_summary(caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    budget = LogBudget("srv", "stderr", logging.getLogger("test.budget"), clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="test.budget"):
        assert all(budget.allow(10) for _ in range(BURST))
        assert not any(budget.allow(10) for _ in range(1000))
        assert caplog.records == []  # nothing summarised while the flood goes on briefly
        now[0] += 1.0
        allowed = sum(budget.allow(10) for _ in range(1000))
        assert allowed == RATE
        assert budget.dropped_total == 2000 - RATE
        [summary] = caplog.records
        assert summary.getMessage() == ("[srv] stderr: 1,000 lines (10,000 bytes) not logged "
                                        "in the last 1 s: over 20 lines/s")
        now[0] += SUMMARY_EVERY + 1
        caplog.clear()
        assert all(budget.allow(1) for _ in range(BURST))
        budget.flush()
        assert len(caplog.records) == 1  # the 980 dropped after the second refill
