"""Smoke test of bench/steps.py: every rung of the ladder runs and its row is printed (no
timing asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_steps_quick_prints_every_rung() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "steps.py"), "--calls", "20", "--rounds", "1"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for rung in ("seam", "+ outcome log", "+ history row", "+ redaction",
                 "+ profile, rate limit", "+ tracing"):
        assert f"| {rung} | " in proc.stdout, proc.stdout
