"""Smoke test of bench/soak.py: both daemons run a few seconds under load with a short
retention and it prints its samples and summary; no timing or growth asserted, only that
every call succeeded and pruning ran."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_soak_quick_runs_both_transports_without_errors() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "soak.py"), "--quick"],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "## Soak (`bench/soak.py`)" in out
    for daemon in ("sidecar stdio", "sidecar /mcp"):
        assert f"| {daemon} | errors | 0 | 0 | ok |" in out, out[-3000:]
        assert f"| {daemon} | RSS MB (after warm-up → end, max) | " in out
        assert f"| {daemon} | open fds (after warm-up: range; max 1st half → 2nd half) | " in out
        assert f"| {daemon} | state dir MB (end; max) | " in out
        assert f"  {daemon} " in out  # live samples were printed
    # a 2-second retention over a 6-second run: each daemon pruned outcomes as it went
    for daemon in ("stdio", "/mcp"):
        pruned = re.search(rf"\| sidecar {daemon} \| at the end \|.*outcomes_pruned ([\d,]+)", out)
        assert pruned is not None and int(pruned[1].replace(",", "")) > 0, out[-2000:]


def test_the_soak_block_goes_before_the_history_and_is_replaced_in_place(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("bench_soak", ROOT / "bench" / "soak.py")
    assert spec is not None and spec.loader is not None
    soak = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = soak  # its dataclasses look their module up
    spec.loader.exec_module(soak)
    results = tmp_path / "RESULTS.md"
    results.write_text("# Results\n\n## Seam\nnumbers\n\n## History (newest first)\nold runs\n")
    soak.write_results(results, "## Soak\nrun one")
    soak.write_results(results, "## Soak\nrun two")
    text = results.read_text()
    assert "run two" in text and "run one" not in text
    assert text.index("## Seam") < text.index("## Soak") < text.index("## History")
    assert text.endswith("## History (newest first)\nold runs\n")
    assert text.count(soak.BEGIN) == text.count(soak.END) == 1
