"""Smoke test of bench/lean_proxy.py: the lean proxy relays real echo calls (the script checks
each target's answers and exits non-zero otherwise) and the table has every target, with the
CPU of each relaying process (no timing asserted)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "lean_proxy.py"
ROW = r"^\| {target} \| [\d,]+ \| [\d.]+x \| {cpu} \|$"


def test_lean_proxy_bench_runs_every_target() -> None:
    run = subprocess.run([sys.executable, SCRIPT, "--rounds", "2", "--block", "20"],
                         capture_output=True, text=True, timeout=300, cwd=SCRIPT.parents[1])
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = {"direct stdio": "", "bare byte relay": r"\d+", "lean proxy": r"\d+",
            "lean proxy, a task per call": r"\d+", "sidecar stdio": r"\d+"}
    for target, cpu in rows.items():
        assert re.search(ROW.format(target=target, cpu=cpu), run.stdout, re.M), run.stdout
