"""Smoke test of the side-by-side benchmark (bench/compare.py): it runs and prints its tables.

No timing is asserted: this only keeps the benchmark from rotting. The sections run with
`--quick --no-external` (no FastMCP / mcp-proxy virtualenvs needed); rows for the sidecar's
MCP facade print "n/a" when `sidecar stdio` is not available.
"""

from __future__ import annotations

import importlib.util
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
    assert "| bare byte relay (floor) | " in out
    assert "no sidecar: spawn + initialize s" in out
    assert "from launch: best s" in out
    assert "| sidecar stdio | " in out  # measured, or "n/a (facade not available ...)"
    assert "| bare Starlette JSON echo | " in out
    assert out.count("|---|") >= 6


def test_results_block_is_replaced_and_the_rest_kept(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("bench_compare", ROOT / "bench" / "compare.py")
    assert spec is not None and spec.loader is not None
    compare = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = compare  # its dataclasses look their module up
    spec.loader.exec_module(compare)
    results = tmp_path / "RESULTS.md"
    results.write_text("# Results\n\nnotes by hand\n")
    compare.write_results(results, "## run one\n| a |")
    compare.write_results(results, "## run two\n| b |")
    text = results.read_text()
    assert text.startswith("# Results\n\nnotes by hand\n")
    assert "run two" in text and "run one" not in text
    assert text.count(compare.BEGIN) == 1 and text.count(compare.END) == 1


def test_a_partial_run_replaces_only_its_sections(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("bench_compare2", ROOT / "bench" / "compare.py")
    assert spec is not None and spec.loader is not None
    compare = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = compare
    spec.loader.exec_module(compare)

    def run(date: str, sections: dict[str, str]) -> str:
        head = f"## benchmarks\n\n- command: `compare.py`\n- date: {date}\n"
        body = "\n".join(f"### {name} table\n| {value} |\n\n_(section {name}: 1.0 s)_\n"
                         for name, value in sections.items())
        return head + "\n" + body

    results = tmp_path / "RESULTS.md"
    everything = {name: f"{name} one" for name in compare.SECTIONS}
    compare.write_results(results, run("day one", everything))
    compare.write_results(results, run("day two", {"catalog": "catalog two"}), ["catalog"])
    text = results.read_text()
    assert "| catalog two |" in text and "| catalog one |" not in text
    assert "| bridge one |" in text and "| startup one |" in text
    assert "- date: day one" in text and "re-run of catalog" in text and "day two" in text
    assert text.index("bridge one") < text.index("catalog two")
