"""Smoke test of bench/codemode.py: both tasks run, with identical answers in both modes
(the script exits non-zero otherwise), and print their tables; on the published servers
Code Mode holds at most a tenth of the direct context (tokens are counted, not timed)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_codemode_bench_runs_both_tasks() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "codemode.py"), "--rounds", "1"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "Task 1 (synthetic)" in out and "Task 2 (servers)" in out, out
    assert out.count("| direct | ") == 2 and out.count("| codemode | ") == 2, out
    ratios = [float(r) for r in re.findall(r"Code Mode context = ([\d.]+)% of direct", out)]
    assert len(ratios) == 2 and ratios[1] <= 10.0, out
    assert "'meeting_in_new_york': '" in out and "'most_linked': [['" in out, out
