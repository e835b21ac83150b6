"""The `sandbox` and `sandbox_default` manifest keys: parsed, defaulted, and every bad value
reported by `sidecar check` with its file and key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bridges.manifest.loading import load_manifests
from bridges.manifest.sandbox import DEFAULT_MEMORY_MB, describe_sandbox, with_default
from bridges.manifest_tools.config import validate_tool_entry

COMMAND = """
kind = "command"
description = "d"
input = { type = "object" }
argv = ["true"]
"""


def _load(tmp_path: Path, text: str):  # type: ignore[no-untyped-def]
    (tmp_path / "m.toml").write_text(text)
    return load_manifests([tmp_path], tool_validator=validate_tool_entry)


def test_default_applies_to_entries_that_do_not_say(tmp_path: Path) -> None:
    loaded = _load(tmp_path, f"""
sandbox_default = {{ memory_mb = 512 }}
[mcpServers.quiet]
command = "node"
[mcpServers.off]
command = "node"
sandbox = false
[mcpServers.own]
command = "node"
sandbox = {{ network = ["api.github.com:443"], write = ["/srv/data"] }}
[mcpServers.remote]
url = "http://127.0.0.1:9/mcp"
[tools.run]
{COMMAND}
""")
    assert loaded.problems == []
    servers = {k: with_default(s.value.sandbox, None) for k, s in loaded.servers.items()}
    assert servers["quiet"] is not None and servers["quiet"].memory_mb == 512
    assert servers["off"] is None
    own = servers["own"]
    assert own is not None and own.memory_mb == DEFAULT_MEMORY_MB
    assert describe_sandbox(own) == {
        "network": ["api.github.com:443"], "read": [], "write": ["/srv/data"], "env": [],
        "memory_mb": DEFAULT_MEMORY_MB, "cpu_seconds": 3600, "pids": 256}
    assert servers["remote"] is None
    tool = loaded.tools["run"].value.sandbox
    assert tool is not None and tool.memory_mb == 512


def test_without_a_default_nothing_is_sandboxed(tmp_path: Path) -> None:
    loaded = _load(tmp_path, f'[mcpServers.a]\ncommand = "node"\n[tools.run]\n{COMMAND}')
    assert loaded.servers["a"].value.sandbox is None
    assert loaded.tools["run"].value.sandbox is None


def test_bad_values_name_the_key(tmp_path: Path) -> None:
    loaded = _load(tmp_path, f"""
[mcpServers.a]
command = "node"
sandbox = {{ network = ["github.com"], memory_mb = 1, read = ["relative"] }}
[mcpServers.b]
command = "node"
sandbox = "yes"
[mcpServers.c]
url = "http://127.0.0.1:9/mcp"
sandbox = true
[tools.run]
{COMMAND}
sandbox = {{ env = ["NOT A NAME"], wrte = ["/x"] }}
""")
    shown = sorted(str(p).split(": ", 1)[1] for p in loaded.problems)
    assert any(s.startswith("$.mcpServers.a.sandbox.network: network[0] = 'github.com' is "
                            'not "host:port"') for s in shown), shown
    assert any(s.startswith("$.mcpServers.a.sandbox.memory_mb: Input should be greater than "
                            "or equal to 32") for s in shown), shown
    assert any(s.startswith("$.mcpServers.a.sandbox.read: [0] 'relative' must be an absolute "
                            "path") for s in shown), shown
    assert any(s.startswith("$.mcpServers.b.sandbox: sandbox must be true, false or a table")
               for s in shown), shown
    assert any(s.startswith("$.mcpServers.c: `sandbox` applies to stdio servers") for s in shown)
    assert any(s.startswith("$.tools.run.sandbox.env: [0] 'NOT A NAME'") for s in shown), shown
    assert any(s.startswith("$.tools.run.sandbox.wrte: unknown key") for s in shown), shown
    assert set(loaded.servers) == set() and loaded.tools == {}


def test_sidecar_check_names_the_file_and_key(tmp_path: Path) -> None:
    manifest = tmp_path / "m.toml"
    manifest.write_text('sandbox_default = { network = "lan" }\n')
    done = subprocess.run([sys.executable, "-m", "sidecar.cli", "check", str(manifest)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert f"{manifest}: $.sandbox_default.network: 'lan' is not a network setting" in (
        done.stdout + done.stderr)
