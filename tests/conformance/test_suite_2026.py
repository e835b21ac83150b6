"""The conformance suite's 0.2.0 line (`@modelcontextprotocol/conformance` 0.2.0-alpha.12, MCP
2026-07-28) in server mode through the sidecar's `/mcp`, run by `scripts/conformance 2026`: a
real `sidecar serve` with the suite's own reference server upstream
(tests/conformance/reference_server/, patched), over HTTP negotiated at 2026-07-28, the same
server held in the handshake era (`legacy`), and the fixture contract server over stdio.

The counts are the suite's own, by scenario (a scenario passes when none of its checks fails):
every one of the 37 scenarios 2026-07-28 requires over HTTP; over `legacy` and `stdio` the ones
that need an upstream speaking 2026-07-28 are listed in
sidecar/serve/mcp_facade/expected-failures-2026-legacy.yml (the script's exit code checks that
nothing else fails). `scripts/bootstrap-servers` installs the suite, Node 22 and the reference
server into .deps/. Each run takes 8 to 15 s. Tasks: all 10 `tasks-*` scenarios
(`tasks-mrtr-composition` through `tasks_fixture.py --mrtr`, a 2026-07-28 upstream that makes
a task of its own after an input round, which the bridge follows).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "conformance"
KIT = REPO / ".deps" / "conformance-0.2" / "node_modules"
REFERENCE = REPO / ".deps" / "conformance-reference" / "node_modules"
_REQUIRED = re.compile(r"^required \(2026-07-28\): (\d+)/(\d+) scenarios passed$", re.M)
_TASKS = re.compile(r"^tasks extension \(SEP-2663\): (\d+)/(\d+) scenarios passed$", re.M)

pytestmark = pytest.mark.skipif(
    not (KIT / "@modelcontextprotocol" / "conformance").is_dir() or not REFERENCE.is_dir(),
    reason="scripts/bootstrap-servers installs the 0.2.0 suite and its reference server",
)


def _run(*args: str) -> str:
    done = subprocess.run([str(SCRIPT), "2026", *args], capture_output=True, text=True,
                          timeout=240, cwd=REPO)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return done.stdout


@pytest.mark.parametrize(("upstream", "passed", "tasks"),
                         [("http", 37, 10), ("legacy", 26, 10), ("stdio", 26, 0)])
def test_required_scenarios_through_the_bridge(upstream: str, passed: int, tasks: int) -> None:
    """`http` and `legacy` also run the tasks fixtures upstream (tasks_fixture.py), so
    the suite's not-scored `tasks-*` scenarios (SEP-2663, the facade's tasks) count too."""
    out = _run(upstream)
    found = _REQUIRED.search(out)
    assert found is not None, out[-3000:]
    assert (int(found[1]), int(found[2])) == (passed, 37), out[-3000:]
    if tasks:
        found = _TASKS.search(out)
        assert found is not None, out[-3000:]
        assert (int(found[1]), int(found[2])) == (tasks, 10), out[-3000:]
