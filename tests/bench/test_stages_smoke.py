"""Smoke test of bench/stages.py: a real daemon with its marks installed answers real calls
through `sidecar stdio`, and every call passes every mark (a renamed or bypassed method would
leave a stage empty and fail here), so the table it prints holds every stage."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("era", ["legacy", "auto"])
def test_stages_prints_every_stage_for_every_call(era: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "stages.py"), "--calls", "40", "--rounds", "1",
         "--era", era],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    for stage in ("route", "facade and seam", "bridge out", "upstream (wall)", "answer back",
                  "outcome record", "way back and wire", "client (wall)"):
        row = re.search(rf"^\| {re.escape(stage)} µs \| (\d+) \|$", out, re.MULTILINE)
        assert row is not None, (stage, out)
        assert int(row.group(1)) > 0, (stage, out)
    assert re.search(r"^\| calls that passed every mark \| 40 \|$", out, re.MULTILINE), out
    cpu = re.search(r"^\| daemon cpu µs/call \| (\d+) \|$", out, re.MULTILINE)
    assert cpu is not None and int(cpu.group(1)) > 0, out
