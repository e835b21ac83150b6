"""Smoke tests of bench/outcome_hop.py and bench/record_inline_ab.py: they run and print
their results (no timing asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_bench(script: str, *args: str) -> list[str]:
    """The lines `bench/<script>` printed; it must exit 0."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()


def test_outcome_hop_prints_a_row_per_gap() -> None:
    lines = run_bench("outcome_hop.py", "--records", "5", "--gaps", "0,1")
    assert lines[0].startswith("outcome record, median of 5")
    assert "insert, warmed cpu us" in lines[1]
    rows = [line.split() for line in lines[2:]]
    assert [row[0] for row in rows] == ["0", "1"]
    assert all(len(row) == 5 and all(float(value) >= 0 for value in row) for row in rows)


def test_record_inline_ab_compares_both_daemons() -> None:
    line = run_bench("record_inline_ab.py", "--blocks", "4", "--calls", "3")[-1]
    assert line.startswith("4 blocks of 3 sequential calls: inline / thread "), line
    assert "calls/s thread " in line and ", inline " in line
