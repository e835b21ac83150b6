"""Smoke test of bench/idle.py: a real daemon with `sidecar stdio` attached is warmed by real
calls and left idle; the table holds each round's CPU and wake-ups, read from the daemon's
threads (an idle daemon still wakes for its timers, so neither reads 0)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_idle_prints_the_daemons_cpu_and_wake_ups_per_round() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "idle.py"), "--seconds", "1.5", "--rounds", "2"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = re.findall(r"^\| (\d+|median) \| (\d+\.\d\d) \| (\d+\.\d) \|$", proc.stdout,
                      re.MULTILINE)
    assert [label for label, _, _ in rows] == ["1", "2", "median"], proc.stdout
    assert all(float(cpu) > 0 and float(wakes) > 0 for _, cpu, wakes in rows), proc.stdout
