"""Smoke test of bench/fleet.py: with real PostgreSQL, SeaweedFS and HAProxy it runs every
section and prints its tables (`--quick`: about 15-20 s, most of it starting the servers and
three `sidecar serve` replicas). No timing is asserted: this keeps the benchmark from rotting,
and checks that the load balancer really spread the callers over both replicas."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_fleet_quick_runs_every_section() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "fleet.py"), "--quick"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    for heading in ("## Fleet backends (`bench/fleet.py`)", "### 1. Durable calls",
                    "### 2. Two replicas vs one behind HAProxy", "### 3. Managed objects"):
        assert heading in out, heading
    for row in ("| SQLite (state dir", "| PostgreSQL, fsync=off (commits reach the kernel",
                "| PostgreSQL, defaults (fsync",
                "| one replica (PostgreSQL) behind HAProxy |", "| one replica (SQLite), no proxy |",
                "| local directory (TextStore) |", "| S3 raw: ranged GET 64 KiB at 0 |"):
        assert row in out, row
    spread = re.search(r"^\| two replicas \(PostgreSQL\) behind HAProxy \|.*\| (\d+)/(\d+) \|$",
                       out, re.MULTILINE)
    assert spread is not None, out[-3000:]
    assert int(spread[1]) > 0 and int(spread[2]) > 0  # both replicas answered
    assert out.count("(target ") >= 4  # a verdict per target


def test_the_fleet_block_is_replaced_in_place(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("bench_fleet", ROOT / "bench" / "fleet.py")
    assert spec is not None and spec.loader is not None
    fleet = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = fleet  # its dataclasses look their module up
    spec.loader.exec_module(fleet)
    results = tmp_path / "RESULTS.md"
    results.write_text("# Results\n\n## Seam\nnumbers\n\n## History (newest first)\nold runs\n")
    fleet.write_results(results, "## Fleet\nrun one")
    fleet.write_results(results, "## Fleet\nrun two")
    text = results.read_text()
    assert "run two" in text and "run one" not in text
    assert text.index("## Seam") < text.index("## Fleet") < text.index("## History")
    assert text.count(fleet.BEGIN) == text.count(fleet.END) == 1
