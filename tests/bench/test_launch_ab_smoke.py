"""Smoke test of bench/launch_ab.py: `sidecar stdio` launched from two trees (here the same
one) until `tools/list` lists every upstream; no timing asserted."""

from __future__ import annotations

from tests.bench.test_outcome_record_smoke import ROOT, run_bench


def test_launch_ab_compares_two_trees() -> None:
    line = run_bench("launch_ab.py", "--old", str(ROOT), "--upstream", "sh", "--servers", "2",
                     "--rounds", "2")[-1]
    assert line.startswith("2 rounds, 2 sh upstream(s): old median "), line
    assert "new / old " in line and f"(old: {ROOT}, new: {ROOT})" in line
