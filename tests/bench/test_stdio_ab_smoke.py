"""Smoke test of bench/stdio_ab.py: two `sidecar stdio` daemons take turns and the script prints
their ratio (here the same tree on both sides; no timing asserted)."""

from __future__ import annotations

from tests.bench.test_outcome_record_smoke import ROOT, run_bench


def test_stdio_ab_compares_two_trees() -> None:
    line = run_bench("stdio_ab.py", "--old", str(ROOT), "--blocks", "4", "--calls", "3")[-1]
    assert line.startswith("4 blocks of sequential 3 calls: new / old "), line
    assert "calls/s old " in line and f"(old: {ROOT}, new: {ROOT})" in line


def test_stdio_ab_with_concurrent_callers() -> None:
    line = run_bench("stdio_ab.py", "--old", str(ROOT), "--blocks", "4", "--calls", "2",
                     "--callers", "3")[-1]
    assert line.startswith("4 blocks of 3 callers x 2 calls: new / old "), line
