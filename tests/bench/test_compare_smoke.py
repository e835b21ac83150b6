"""Smoke test of the side-by-side benchmark (bench/compare.py): it runs and prints its tables.

No timing is asserted: this only keeps the benchmark from rotting. The sections run with
`--quick --no-external` (no FastMCP / mcp-proxy virtualenvs needed); rows for the sidecar's
MCP facade print "n/a" when `sidecar stdio` is not available.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_compare_quick_prints_every_table() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "compare.py"), "--quick", "--no-external",
         "--only", "bridge,native,large,startup,catalog"],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    for heading in ("- machine:", "- versions:", "- command:", "### 1. Bridge", "### 2. Native API",
                    "### 3. Large text outputs", "### 4. Startup", "### 5. Catalog scale"):
        assert heading in out, heading
    assert "FAILED" not in out
    assert "| direct stdio | " in out
    assert "| sidecar stdio | " in out  # measured, or "n/a (facade not available ...)"
    assert "| bare Starlette JSON echo | " in out
    assert out.count("|---|") >= 6
