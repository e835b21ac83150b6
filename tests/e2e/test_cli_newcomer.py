"""What a new user meets first, against a real `sidecar serve` and the real CLI: health says
why it is degraded (a held definition too) and a held tool says how to approve it; tokens,
auth and listing commands name what was wrong in one line."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.bridges.helpers import TESTSERVER
from tests.hardening.daemon_process import Daemon, run_cli, serving, sidecar_env


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    root = tmp_path_factory.mktemp("newcomer")
    manifests = root / "manifests"
    manifests.mkdir()
    alpha = {"command": sys.executable, "args": [str(TESTSERVER)], "pin": "hold"}
    (manifests / "servers.json").write_text(json.dumps({
        "mcpServers": {"alpha": alpha},
        "default_profile": "coding",
        "profiles": {"coding": {"servers": ["alpha"], "exclude": ["alpha_crash"]}},
    }))
    with serving(root / "state", manifests=manifests) as daemon:
        yield daemon


def _env(daemon: Daemon) -> dict[str, str]:
    return sidecar_env(daemon.state, daemon.state.parent / "manifests")


def _held(daemon: Daemon, name: str, timeout: float = 30) -> None:
    headers = {"authorization": f"Bearer {daemon.token}"}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        report = httpx.get(f"{daemon.url}/v1/health", headers=headers, timeout=30).json()
        if any(c["tool"] == name for c in report["definition_changes"]):
            return
        time.sleep(0.05)
    raise AssertionError(f"{name} not held within {timeout} s")


def test_profiles_on_the_cli_and_every_tool_for_the_operator(daemon: Daemon) -> None:
    env = _env(daemon)
    default = run_cli("tools", env=env)
    assert default.returncode == 0 and "alpha_echo" in default.stdout
    assert "alpha_crash" not in default.stdout  # the default profile leaves it out
    every = run_cli("tools", "--all", env=env)
    assert every.returncode == 0 and "alpha_crash" in every.stdout
    named = run_cli("tools", "--profile", "coding", "--json", env=env)
    assert "alpha_crash" not in [t["name"] for t in json.loads(named.stdout)]
    nope = run_cli("tools", "--profile", "nope", env=env)
    assert nope.returncode == 2 and "known profiles: coding" in nope.stderr
    called = run_cli("call", "alpha_echo", "--profile", "coding", "--input", '{"text": "hi"}',
                     env=env)
    assert called.returncode == 0 and "hi" in called.stdout
    outside = run_cli("call", "alpha_crash", "--profile", "coding", env=env)
    assert outside.returncode == 1 and "unknown_tool" in outside.stderr


def test_a_held_definition_is_a_health_reason_and_a_call_names_the_approval(
        daemon: Daemon) -> None:
    env = _env(daemon)
    # alpha lists a new tool: under `pin = "hold"` it is withdrawn until approved
    added = run_cli("call", "alpha_mutate", "--input", '{"add": ["newcomer"]}', env=env)
    assert added.returncode == 0, added.stderr
    _held(daemon, "alpha_newcomer")

    health = run_cli("health", env=env)
    assert health.returncode == 1
    assert "degraded because:" in health.stdout
    assert "tool alpha_newcomer (alpha/newcomer) changed upstream and is held" in health.stdout
    assert "`sidecar tools approve alpha_newcomer`" in health.stdout

    called = run_cli("call", "alpha_newcomer", env=env)
    assert called.returncode == 1
    assert "Tool alpha_newcomer is held" in called.stderr and "unavailable" in called.stderr
    assert "`sidecar tools approve alpha_newcomer`" in called.stderr
    approved = run_cli("tools", "approve", "alpha_newcomer", env=env)
    assert approved.returncode == 0, approved.stderr
    ran = run_cli("call", "alpha_newcomer", env=env)
    assert ran.returncode == 0, ran.stderr
    assert run_cli("health", env=env).returncode == 0


def test_token_commands_name_the_declared_profiles(daemon: Daemon) -> None:
    env = _env(daemon)
    none = run_cli("token", "list", env=env)
    assert none.returncode == 0 and "no scoped tokens" in none.stderr
    refused = run_cli("token", "create", "--profile", "nope", env=env)
    assert refused.returncode == 2
    assert "no profile 'nope'" in refused.stderr and "declared: coding" in refused.stderr
    assert "no scoped tokens" in run_cli("token", "list", env=env).stderr  # nothing made
    made = run_cli("token", "create", "--profile", "coding", env=env)
    assert made.returncode == 0 and made.stdout.startswith("sct_")
    # every tool (`tools --all`) is for the all-access token only
    every = f"{daemon.url}/v1/tools?profile=*"
    scoped = httpx.get(every, headers={"authorization": f"Bearer {made.stdout.strip()}"})
    assert scoped.status_code == 403 and scoped.json()["error"]["code"] == "forbidden_profile"
    full = httpx.get(every, headers={"authorization": f"Bearer {daemon.token}"})
    assert "alpha_crash" in [t["name"] for t in full.json()["tools"]]


def test_auth_commands_on_a_stdio_an_unknown_and_an_unreachable_server(tmp_path: Path) -> None:
    manifests = tmp_path / "m"
    manifests.mkdir()
    (manifests / "a.toml").write_text(
        '[mcpServers.remote]\nurl = "http://127.0.0.1:9/mcp"\nauth = "oauth"\n\n'
        '[mcpServers.local]\ncommand = "cat"\n')
    env = sidecar_env(tmp_path / "state", manifests)
    for name, says in (("local", "'local' is a stdio server"), ("nope", "no server 'nope'")):
        status = run_cli("auth", "status", name, env=env)
        assert status.returncode == 2, status.stdout
        assert says in status.stderr and "servers that may: remote" in status.stderr
        login = run_cli("auth", "login", name, env=env)
        assert login.returncode == 2 and says in login.stderr
    failed = run_cli("auth", "login", "remote", "--no-browser", env=env, timeout=120)
    assert failed.returncode == 1
    lines = failed.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in failed.stderr, failed.stderr
    assert lines[0].startswith("sidecar auth login: remote: no tokens stored")
    assert "sidecar auth login remote" not in lines[0]


def test_check_reports_every_problem_of_an_entry_and_programs_that_do_not_exist(
        tmp_path: Path) -> None:
    (tmp_path / "a.toml").write_text(
        '[mcpServers.gitx]\ncommand = "uvx-no-such-program"\nargs = "x"\n'
        'namepsace = "g"\n\n'
        '[mcpServers.ok]\ncommand = "no-such-program-either"\n\n'
        '[tools.run]\nkind = "command"\ndescription = "d"\ninput = { type = "object" }\n'
        'argv = ["no-such-binary-zz", "-v"]\n')
    checked = run_cli("check", str(tmp_path / "a.toml"), env=sidecar_env(tmp_path / "state"))
    assert checked.returncode == 1
    out = checked.stdout
    assert "$.mcpServers.gitx.args: Input should be a valid list" in out
    assert "$.mcpServers.gitx.namepsace" in out and "did you mean 'namespace'?" in out
    assert "$.mcpServers.ok.command: command 'no-such-program-either' does not exist" in out
    assert "$.tools.run.argv[0]: command 'no-such-binary-zz' does not exist" in out
    assert not (tmp_path / "state").exists()  # nothing started, nothing written


def test_help_pages_and_client_config_json(tmp_path: Path) -> None:
    import argparse
    import re

    from sidecar.cli.commands import HELP_DESCRIPTION
    from sidecar.cli.parser import build_parser

    def pages(parser: argparse.ArgumentParser, path: list[str]) -> Iterator[tuple[str, str]]:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    assert sub.description, f"`sidecar {' '.join([*path, name])} --help`"
                    yield " ".join([*path, name]), sub.format_help()
                    yield from pages(sub, [*path, name])

    parser = build_parser(HELP_DESCRIPTION)
    every = [("", parser.format_help()), *pages(parser, [])]
    assert len(every) > 20
    for name, text in every:
        assert not re.search(r"\b(sidecar|bridges|managed_store)\.[a-z_]+", text), name
    env = sidecar_env(tmp_path / "state")
    for command in (["check", "--help"], ["asks", "--help"], ["token", "create", "--help"]):
        shown = run_cli(*command, env=env)
        assert shown.returncode == 0 and "\n\nusage" not in shown.stdout
        assert shown.stdout.split("\n\n")[1].strip()  # the description, after the usage
    codex = run_cli("client-config", "codex", "--json", env=env)
    assert codex.returncode == 0, codex.stderr
    entry = json.loads(codex.stdout)["mcp_servers"]["sidecar"]
    assert entry["args"][0] == "stdio"
