"""Issue 26 item 5: an upstream writing 100,000 log notifications and 10 MB of stderr does not
grow the daemon log without bound: the lines past each server's budget are counted and
summarised."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.hardening.conftest import start_daemon, stop_daemon

SERVER = Path(__file__).parent / "servers" / "flood_server.py"


def test_a_flooding_upstream_is_summarised_not_logged(tmp_path: Path) -> None:
    manifest = {"mcpServers": {"noisy": {"command": sys.executable, "args": [str(SERVER)]}}}
    daemon = start_daemon(tmp_path, manifests={"noisy.json": json.dumps(manifest)})
    try:
        for _ in range(100):  # the server is listed once it is ready
            if daemon.health(timeout=30)["servers"].get("noisy", {}).get("state") == "ready":
                break
        outcome = daemon.call("noisy_flood", {"lines": 100_000}, "flood")
        assert outcome["status"] == "completed", outcome
        assert outcome["content"][0]["text"] == "flooded 100000"
        daemon.health()
    finally:
        stop_daemon(daemon)
    log = daemon.log()
    # 100,000 x ~100-byte lines from each source would be over 20 MB of log
    assert len(log.encode()) < 1_000_000, len(log.encode())
    assert "[noisy] log notifications:" in log and "[noisy] stderr:" in log
    assert "not logged in the last" in log
    assert sum("e" * 99 in line for line in log.splitlines()) <= 1000
