"""The commands that read the state directory's own stores (tokens, the call history, what an
`--embedded` run cannot do) open those stores without importing the daemon: `sidecar token
list` took 2.4 s of a 2-core machine when it did (the daemon, the MCP SDK, the bridges), 0.5-0.8
s without (2026-12-07)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

DAEMON_ONLY = ("sidecar.daemon.daemon", "sidecar.daemon.sources", "bridges.mcp.connection")


@pytest.mark.parametrize("command", [
    ["token", "list"], ["calls", "--embedded"], ["asks", "--embedded"],
    ["logs", "any", "--embedded"],
])
def test_a_store_command_imports_no_daemon(command: list[str], tmp_path: Path) -> None:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SIDECAR_")},
           "SIDECAR_STATE_DIR": str(tmp_path / "state")}
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "sidecar.cli", *command],
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()
                if line.startswith("import time:")}
    assert "sidecar.cli.commands" in imported, done.stderr[-2000:]  # the check can see imports
    assert not imported & set(DAEMON_ONLY), (command, imported & set(DAEMON_ONLY))
    said = [line for line in done.stderr.splitlines() if not line.startswith("import time:")]
    assert "Traceback" not in done.stderr, said
    if command[0] == "token":
        assert done.returncode == 0, said
    elif command[0] == "calls":
        assert done.returncode == 0 and said == ["no calls match"], (done.stdout, said)
    else:  # asks and the servers live in a running daemon: one line says so
        assert done.returncode == 2 and "--embedded has none" in said[-1], said
