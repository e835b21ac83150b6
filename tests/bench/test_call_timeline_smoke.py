"""Smoke test of bench/call_timeline.py: its hooks still sit on the daemon's call path (every
segment has a time) and it prints both rates (no timing asserted)."""

from __future__ import annotations

from tests.bench.test_outcome_record_smoke import run_bench


def test_call_timeline_times_every_segment() -> None:
    lines = run_bench("call_timeline.py", "--blocks", "2", "--calls", "4", "--warm", "3")
    assert lines[0].startswith("call timeline: `sidecar stdio` (upstream protocol legacy)")
    assert lines[1].startswith("calls/s: sidecar "), lines[1]
    assert "(8 daemon calls timed)" in lines[2], lines[2]
    rows = [line.split(" | ") for line in lines if line.startswith("| ") and "---" not in line]
    assert rows[0][0] == "| segment (daemon's clock)"
    segments = rows[1:]
    assert len(segments) == 12, segments
    for row in segments:
        assert float(row[1]) >= 0, row  # a row with no time fails here: its hook is off the path
    assert lines[-1].startswith("daemon on the call's path"), lines[-1]
