"""Smoke test of bench/lean_proxy.py: the lean proxy relays real echo calls (the script checks
each target's answers and exits non-zero otherwise) and the table has every target, with the
CPU of each relaying process (no timing asserted)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_lean_proxy_bench_runs_every_target() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "lean_proxy.py"), "--rounds", "2", "--block", "20"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert re.search(r"^\| direct stdio \| [\d,]+ \| 1\.00x \|  \|$", out, re.M), out
    for target in ("bare byte relay", "lean proxy", "sidecar stdio"):
        assert re.search(rf"^\| {target} \| [\d,]+ \| [\d.]+x \| \d+ \|$", out, re.M), out
