"""Smoke test of bench/steps.py: every rung of the ladder and every row of the step table runs
and is printed, each priced against the row it names (no timing asserted)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_steps_quick_prints_every_rung_and_step() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "steps.py"), "--calls", "20", "--rounds", "1"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "| step | calls/s | cpu µs/call | price µs (vs the rung above) |" in out, out
    for rung in ("seam", "+ outcome log", "+ history row", "+ redaction",
                 "+ profile, rate limit", "+ pins", "+ permission (allow rule)", "+ tracing"):
        assert f"| {rung} | " in out, out
        if rung != "seam":  # a price: a signed whole number of µs
            assert re.search(rf"^\| {re.escape(rung)} \| [\d,]+ \| \d+ \| [+-]\d+ \|$", out,
                             re.M), out
    assert "| step | calls/s | cpu µs/call | price µs | compared with |" in out, out
    unchecked = "seam, input unchecked"
    assert f"| {unchecked} | " in out, out
    for step, against in (
        ("decode: echo schema (the seam rung)", unchecked),
        ("decode: a 22-field schema", unchecked),
        ("seam + profile, rate limit", "seam"),
        ("seam + pins", "seam"),
        ("seam + permission (allow rule)", "seam"),
        ("upstream round trip (stdio)", "seam"),
        ("8 KB result, not bounded", "seam"),
        ("bounding: 8 KB result to 2 KB", "8 KB result, not bounded"),
        ("parse: MCP request line", "seam"),
        ("encode: MCP result line", "seam"),
    ):
        row = next((line for line in out.splitlines() if line.startswith(f"| {step} | ")), None)
        assert row is not None, f"{step!r} missing:\n{out}"
        assert re.fullmatch(rf"\| {re.escape(step)} \| [\d,]+ \| \d+ \| [+-]\d+ \| "
                            rf"{re.escape(against)} \|", row), row
