"""Smoke test of the side-by-side benchmark (bench/compare.py): each section runs and prints its
table.

Timing is guarded loosely, on the bridge only: `sidecar stdio`'s median block ratio to direct
stdio in the same run must stay above `RATIO_FLOOR` (the target is 0.6x sequential, 0.8x with
16 callers; a quick run on a shared 2-core CI machine swings by half, so the floor only catches
a call path that got several times slower). Otherwise this keeps the benchmark from rotting.
Each section runs in a
`--quick --no-external` process of its own (no FastMCP / mcp-proxy virtualenvs needed), so the
suite's workers run them side by side; rows for the sidecar's MCP facade print "n/a" when
`sidecar stdio` is not available.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# What each section's output must hold besides its table: its heading, then its rows.
SECTIONS = {
    # (the sidecar rows: measured, or "n/a (facade not available ...)")
    "bridge": ("### 1. Bridge", "| direct stdio | ", "| bare byte relay (floor) | ",
               "| lean proxy (the per-call work alone) | ", "| sidecar stdio | ",
               "| direct stdio, era auto (2026-07-28) | "),
    "native": ("### 2. Native API", "| bare Starlette JSON echo | "),
    "large": ("### 3. Large text outputs",),
    "startup": ("### 4. Startup", "no sidecar: spawn + initialize s", "from launch: best s"),
    "catalog": ("### 5. Catalog scale",),
}
TABLES = {"bridge": 3, "native": 1, "large": 1, "startup": 1, "catalog": 1}
RATIO_FLOOR = 0.2


def test_every_section_is_smoke_tested() -> None:
    spec = importlib.util.spec_from_file_location("bench_compare0", ROOT / "bench" / "compare.py")
    assert spec is not None and spec.loader is not None
    compare = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = compare
    spec.loader.exec_module(compare)
    assert tuple(SECTIONS) == compare.SECTIONS == tuple(TABLES)


@pytest.mark.parametrize("section", SECTIONS)
def test_compare_quick_prints_the_section_table(section: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "compare.py"), "--quick", "--no-external",
         "--only", section],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    for line in ("- machine:", "- versions:", "- command:", *SECTIONS[section]):
        assert line in out, line
    assert "FAILED" not in out
    assert f"_(section {section}: " in out
    assert out.count("|---|") >= TABLES[section]
    if section == "bridge" and "| sidecar stdio | n/a" not in out:
        verdict = re.search(r"^- sidecar stdio: sequential: ([\d.]+)x direct .*"
                            r"16 concurrent: ([\d.]+)x direct", out, re.MULTILINE)
        assert verdict is not None, out
        assert min(float(verdict[1]), float(verdict[2])) >= RATIO_FLOOR, verdict[0]


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
        head = (f"## benchmarks\n\n- machine: vm of {date}\n- command: `compare.py`\n"
                f"- date: {date}\n")
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
    rerun = next(line for line in text.splitlines() if line.startswith("- re-run of catalog"))
    assert "vm of day two" in rerun  # a re-run names its machine too
    assert text.index("bridge one") < text.index("catalog two")
