"""The client side of set-up, in subprocesses: `sidecar --version`, `client-config` (print and
`--install` into a config file), `--input @FILE` / `--input -`, and the bundled manifests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SIDECAR = [sys.executable, "-m", "sidecar.cli"]
ECHO = """
[tools.shout]
kind = "command"
description = "prints its text"
input = { type = "object", properties = { text = { type = "string" } }, required = ["text"] }
argv = ["printf", "%s", "{text}"]
"""


def run(*args: str, env: dict[str, str], stdin: str | None = None,
        cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SIDECAR, *args], capture_output=True, text=True, timeout=120,
                          env=env, input=stdin, cwd=cwd, check=False)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SIDECAR_")}
    return {**clean, "SIDECAR_STATE_DIR": str(tmp_path / "state"), "HOME": str(tmp_path)}


def test_version(env):
    done = run("--version", env=env)
    assert done.returncode == 0 and done.stdout.strip() == "sidecar 0.1.0"


@pytest.mark.parametrize("client", ["claude-desktop", "claude-code", "cursor", "generic"])
def test_client_config_prints_absolute_paths(client, env, tmp_path):
    manifests = tmp_path / "m"
    manifests.mkdir()
    done = run("client-config", client, "--manifests", "m", env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    entry = json.loads(done.stdout)["mcpServers"]["sidecar"]
    assert Path(entry["command"]).is_absolute() and Path(entry["command"]).exists()
    assert entry["args"] == ["stdio", "--state-dir", str((tmp_path / "state").resolve()),
                             "--manifests", str(manifests.resolve())]


def test_client_config_vscode_and_codex_formats(env, tmp_path):
    vscode = json.loads(run("client-config", "vscode", "--no-manifests", env=env).stdout)
    assert vscode["servers"]["sidecar"]["type"] == "stdio"
    assert vscode["servers"]["sidecar"]["args"][-1] == "--no-manifests"
    codex = run("client-config", "codex", "--no-manifests", env=env).stdout
    assert codex.startswith("[mcp_servers.sidecar]\ncommand = \"/")
    assert 'args = ["stdio", "--state-dir", ' in codex


def test_client_config_install_merges_after_showing_the_diff(env, tmp_path):
    config = tmp_path / "claude.json"
    config.write_text(json.dumps({"mcpServers": {"other": {"command": "x"}}, "theme": "dark"}))
    dry = run("client-config", "claude-desktop", "--install", "--dry-run", "--config-file",
              str(config), "--no-manifests", env=env)
    assert dry.returncode == 0 and '+    "sidecar": {' in dry.stdout
    assert "sidecar" not in json.loads(config.read_text())["mcpServers"]  # nothing written
    done = run("client-config", "claude-desktop", "--install", "--config-file", str(config),
               "--no-manifests", env=env)
    assert done.returncode == 0, done.stderr
    assert f"--- {config} (before)" in done.stdout and '+    "sidecar": {' in done.stdout
    assert f"sidecar: wrote {config}" in done.stderr
    written = json.loads(config.read_text())
    assert written["theme"] == "dark" and written["mcpServers"]["other"] == {"command": "x"}
    assert written["mcpServers"]["sidecar"]["args"][0] == "stdio"
    again = run("client-config", "claude-desktop", "--install", "--config-file", str(config),
                "--no-manifests", env=env)
    assert "already holds this configuration" in again.stdout
    toml = tmp_path / "config.toml"
    toml.write_text('model = "x"\n\n[mcp_servers.sidecar]\ncommand = "old"\n\n[other]\na = 1\n')
    run("client-config", "codex", "--install", "--config-file", str(toml), "--no-manifests",
        env=env)
    text = toml.read_text()
    assert text.startswith('model = "x"\n') and "[other]\na = 1\n" in text
    assert 'command = "old"' not in text and text.count("[mcp_servers.sidecar]") == 1
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    refused = run("client-config", "cursor", "--install", "--config-file", str(bad), env=env)
    assert refused.returncode == 2 and "does not hold a JSON object" in refused.stderr


def test_input_from_a_file_and_from_stdin(env, tmp_path):
    manifests = tmp_path / "m"
    manifests.mkdir()
    (manifests / "shout.toml").write_text(ECHO)
    env = {**env, "SIDECAR_MANIFESTS": str(manifests)}
    (tmp_path / "in.json").write_text(json.dumps({"text": "from a file"}))
    from_file = run("call", "shout", "--embedded", "--input", f"@{tmp_path / 'in.json'}",
                    env=env)
    assert from_file.returncode == 0 and from_file.stdout == "from a file\n", from_file.stderr
    from_stdin = run("call", "shout", "--embedded", "--input", "-", env=env,
                     stdin=json.dumps({"text": "from stdin"}))
    assert from_stdin.returncode == 0 and from_stdin.stdout == "from stdin\n"
    missing = run("call", "shout", "--embedded", "--input", "@/nonexistent.json", env=env)
    assert missing.returncode == 2 and "sidecar: --input: " in missing.stderr


def test_no_manifests_named_loads_the_bundled_directory(env):
    listing = run("tools", "--embedded", env=env)  # SIDECAR_MANIFESTS unset
    assert listing.returncode == 0 and "utc_now" in listing.stdout, listing.stderr
    empty = run("tools", "--embedded", env={**env, "SIDECAR_MANIFESTS": ""})
    assert "utc_now" not in empty.stdout  # set but empty: none
