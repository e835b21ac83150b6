"""Manifests: the shapes other clients write load unchanged; faults are precise problems."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema

from bridges.manifest.loading import ServerConfig, load_manifests
from bridges.manifest.schema import manifest_json_schema

ROOT = Path(__file__).resolve().parents[2]

DESIGN_EXAMPLE = """
[mcpServers.git]                 # an MCP server over stdio
command = "python"
args = ["-m", "mcp_server_git", "-r", "."]
env = { GIT_PAGER = "cat" }
namespace = "git"
tools = { allow = ["git_*"], deny = ["git_reset"] }
timeouts = { startup = 30, call = 600 }
bounds = { max_bytes = 51200, max_lines = 2000 }

[mcpServers.docs]
url = "http://127.0.0.1:9000/mcp"
headers = { Authorization = "Bearer ${env:DOCS_TOKEN}" }

[tools.weather]
kind = "http"
description = "Current weather for a city"
input = { type = "object", properties = { city = { type = "string" } }, required = ["city"] }
request = { method = "GET", url = "http://127.0.0.1:9001/weather?city={city}" }

[[permissions.rules]]
action = "git_commit"
decision = "ask"
"""

CLAUDE_DESKTOP = {
    "mcpServers": {
        "filesystem": {
            "command": "npx",
            "args": ["-y", "@modelcontextprotocol/server-filesystem", "/Users/me/Desktop"],
        },
        "github": {
            "command": "docker",
            "args": ["run", "-i", "--rm", "ghcr.io/github/github-mcp-server"],
            "env": {"GITHUB_PERSONAL_ACCESS_TOKEN": "ghp_secret_value"},
        },
        "remote": {"type": "sse", "url": "http://127.0.0.1:8123/sse"},
    },
    "globalShortcut": "Ctrl+Space",
}

VSCODE = {
    "inputs": [{"type": "promptString", "id": "key", "password": True}],
    "servers": {
        "fetch": {"type": "stdio", "command": "uvx", "args": ["mcp-server-fetch"]},
        "api": {"type": "http", "url": "http://127.0.0.1:3000/mcp", "headers": {"X-K": "v"}},
    },
}


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_design_example_loads(tmp_path):
    write(tmp_path, "main.toml", DESIGN_EXAMPLE)
    loaded = load_manifests([tmp_path], environ={"DOCS_TOKEN": "t0k3n"})
    assert loaded.errors == []
    git = loaded.servers["git"].value
    assert git.transport == "stdio" and git.namespace == "git"
    assert git.tools.deny == ["git_reset"] and git.bounds.max_bytes == 51200
    docs = loaded.servers["docs"].value
    assert docs.transport == "http" and docs.headers["Authorization"] == "Bearer t0k3n"
    assert loaded.tools["weather"].value["kind"] == "http"
    assert [(r.action, r.decision) for r in loaded.rules] == [("git_commit", "ask")]


def test_claude_desktop_and_vscode_files_load_unchanged(tmp_path):
    write(tmp_path, "claude_desktop_config.json", json.dumps(CLAUDE_DESKTOP))
    write(tmp_path, "mcp.json", json.dumps(VSCODE))
    loaded = load_manifests([tmp_path], environ={})
    assert loaded.errors == []
    assert set(loaded.servers) == {"filesystem", "github", "remote", "fetch", "api"}
    assert loaded.servers["remote"].value.transport == "sse"
    assert loaded.servers["api"].value.transport == "http"
    assert loaded.servers["filesystem"].value.effective_namespace("filesystem") == "filesystem"
    notes = [p for p in loaded.problems if p.severity == "note"]
    assert any(p.path == "$.globalShortcut" for p in notes)


def test_missing_environment_variable_names_file_server_and_key(tmp_path):
    path = write(tmp_path, "m.toml", DESIGN_EXAMPLE)
    loaded = load_manifests([path], environ={})
    (problem,) = loaded.errors
    assert problem.file == str(path)
    assert problem.path == "$.mcpServers.docs.headers.Authorization"
    assert "DOCS_TOKEN" in problem.message
    assert "git" in loaded.servers and "docs" not in loaded.servers  # the valid one loads


def test_invalid_entries_are_reported_with_paths_and_valid_ones_still_load(tmp_path):
    write(tmp_path, "a.json", json.dumps({"mcpServers": {
        "ok": {"command": "x"},
        "both": {"command": "x", "url": "http://127.0.0.1:1/mcp"},
        "badtimeout": {"command": "x", "timeouts": {"call": -1}},
        "badargs": {"command": "x", "args": ["ok", 3]},
    }}))
    write(tmp_path, "b.json", '{"mcpServers": {"ok": {"command": "y"}}, ')  # syntax error
    write(tmp_path, "c.json", json.dumps({"mcpServers": {"ok": {"command": "z"}}}))
    loaded = load_manifests([tmp_path], environ={})
    assert set(loaded.servers) == {"ok"}
    assert loaded.servers["ok"].value.command == "x"  # the first definition wins
    by_path = {p.path: p for p in loaded.errors}
    assert "exactly one of" in by_path["$.mcpServers.both"].message
    assert "$.mcpServers.badtimeout.timeouts.call" in by_path
    assert "$.mcpServers.badargs.args[1]" in by_path
    syntax = [p for p in loaded.errors if p.file.endswith("b.json")]
    assert syntax and "line 1" in syntax[0].message
    dup = by_path["$.mcpServers.ok"]
    assert dup.file.endswith("c.json") and "a.json" in dup.message


def test_an_unknown_protocol_era_is_a_manifest_error(tmp_path):
    write(tmp_path, "m.json", json.dumps({"mcpServers": {
        "old": {"command": "x", "protocol": "2019-01-01"},
        "legacy": {"command": "x", "protocol": "legacy"},
    }}))
    loaded = load_manifests([tmp_path], environ={})
    assert set(loaded.servers) == {"legacy"}
    (problem,) = loaded.errors
    assert problem.path == "$.mcpServers.old.protocol"


def test_secrets_never_show_in_reprs():
    config = ServerConfig(command="x", env={"TOKEN": "s3cr3t"}, headers={"A": "B3arer"})
    assert "s3cr3t" not in repr(config) and "B3arer" not in repr(config)


def test_shipped_schema_is_current_and_accepts_the_examples():
    shipped = json.loads((ROOT / "schema" / "manifest.schema.json").read_text())
    assert shipped == json.loads(json.dumps(manifest_json_schema()))
    validator = jsonschema.Draft202012Validator(shipped)
    import tomllib

    for example in (tomllib.loads(DESIGN_EXAMPLE), CLAUDE_DESKTOP, VSCODE):
        assert list(validator.iter_errors(example)) == []
    bad = {"mcpServers": {"x": {"command": "c", "timeouts": {"call": "soon"}}}}
    assert list(validator.iter_errors(bad))


def test_sidecar_check_reports_file_path_and_hint(tmp_path):
    good = write(tmp_path, "good.toml", '[mcpServers.a]\ncommand = "sh"\n')
    bad = write(tmp_path, "bad.json", json.dumps({"mcpServers": {"b": {"args": []}}}))
    run = [sys.executable, "-m", "sidecar.cli", "check"]
    ok = subprocess.run([*run, str(good)], capture_output=True, text=True, check=False)
    assert ok.returncode == 0, ok.stderr
    assert "1 server(s)" in ok.stdout and "0 error(s)" in ok.stdout
    res = subprocess.run([*run, str(good), str(bad)], capture_output=True, text=True,
                         check=False)
    assert res.returncode == 1
    assert f"{bad}: $.mcpServers.b: a server needs exactly one of" in res.stdout
    assert "hint:" in res.stdout
    usage = subprocess.run(run, capture_output=True, text=True, check=False)
    assert usage.returncode == 2


def test_sidecar_check_fails_on_unknown_keys_with_a_suggestion_unless_allowed(tmp_path):
    typos = write(tmp_path, "typos.toml", """
[mcpServer.x]
command = "y"

[mcpServers.git]
command = "python"
argz = ["-m", "mcp_server_git"]
""")
    run = [sys.executable, "-m", "sidecar.cli", "check"]
    strict = subprocess.run([*run, str(typos)], capture_output=True, text=True, check=False)
    assert strict.returncode == 1, strict.stdout
    assert (f"note: {typos}: $.mcpServer: unknown top-level key, ignored "
            "(hint: did you mean 'mcpServers' or 'servers'?)") in strict.stdout
    assert f"{typos}: $.mcpServers.git.argz: key not used by mcp-sidecar, kept as is " \
        "(hint: did you mean 'args'?)" in strict.stdout
    assert "0 error(s), 2 unknown key(s)" in strict.stdout
    assert "--allow-unknown" in strict.stdout
    allowed = subprocess.run([*run, "--allow-unknown", str(typos)], capture_output=True,
                             text=True, check=False)
    assert allowed.returncode == 0, allowed.stdout
    assert "2 unknown key(s) (allowed)" in allowed.stdout
    as_json = subprocess.run([*run, "--json", str(typos)], capture_output=True, text=True,
                             check=False)
    assert as_json.returncode == 1
    assert [p["unknown_key"] for p in json.loads(as_json.stdout)["problems"]] == [True, True]
    # the daemon still loads the server (a Claude Desktop file's own keys must not stop it)
    loaded = load_manifests([typos])
    assert list(loaded.servers) == ["git"] and not loaded.errors


def test_misspelt_tool_kind_and_keys_are_errors_that_suggest_the_right_word(tmp_path):
    typos = write(tmp_path, "tools.toml", """
[mcpServers.s]
command = "x"
timeouts = { startup = 30, cal = 5 }

[tools.shell]
kind = "shell"

[tools.comand]
kind = "comand"

[tools.missing]
description = "no kind"

[tools.v]
kind = "command"
description = "d"
input = { type = "object", properties = {} }
argv = ["true"]
progres = true
""")
    done = subprocess.run([sys.executable, "-m", "sidecar.cli", "check", str(typos)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert f"error: {typos}: $.mcpServers.s.timeouts.cal: unknown key (hint: did you mean " \
        "'call'?)" in lines
    assert f"error: {typos}: $.tools.shell.kind: 'shell' is not a manifest tool kind (hint: " \
        'write kind = "http" or kind = "command")' in lines
    assert f"error: {typos}: $.tools.comand.kind: 'comand' is not a manifest tool kind " \
        "(hint: did you mean 'command'?)" in lines
    assert any(line.startswith(f"error: {typos}: $.tools.missing.kind: kind is missing")
               for line in lines)
    assert f"error: {typos}: $.tools.v.progres: unknown key (hint: did you mean " \
        "'progress'?)" in lines
    assert "kind is '" not in done.stdout
