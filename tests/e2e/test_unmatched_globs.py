"""A glob of a rule, profile, override or rate limit that matches no tool decides nothing, so
it is reported: by a real `sidecar serve` at start and at each reload (one log line, a health
reason) and by `sidecar check --live` against that daemon's tools."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.hardening.daemon_process import SIDECAR, run_cli, sidecar_env

TOOLS = """
[tools.git_status]
kind = "command"
description = "status"
input = { type = "object" }
argv = ["echo", "clean"]

[tools.git_commit]
kind = "command"
description = "commit"
input = { type = "object" }
argv = ["echo", "committed"]

[tools.deploy]
kind = "command"
description = "deploy"
input = { type = "object" }
argv = ["echo", "deployed"]
"""
# the names docs/profiles.md used to show: no tool has them
WRONG = 'default_profile = "coding"\n' + TOOLS + """
[[permissions.rules]]
action = "git_git_commit"
decision = "ask"

[rate_limits."fetch_*"]
calls_per_minute = 5

[tools.overrides."git_git_status"]
description_append = "Prefer this to running git in a shell."

[profiles.coding]
include = ["git_*"]
exclude = ["git_git_push*", "deploy"]
"""
RIGHT = WRONG.replace("git_git_", "git_").replace('"fetch_*"', '"git_*"').replace(
    'exclude = ["git_push*", "deploy"]', 'exclude = ["deploy"]')


def _wait(predicate, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.05)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[dict[str, object]]:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "agents.toml").write_text(WRONG)
    state, log = tmp_path / "state", tmp_path / "serve.log"
    env = sidecar_env(state, manifests)
    with log.open("w") as err:
        proc = subprocess.Popen([*SIDECAR, "serve", "--port", "0"], env=env, stderr=err,
                                stdout=subprocess.DEVNULL)
    try:
        _wait(lambda: "listening on" in log.read_text() or proc.poll() is not None, "listening")
        url = re.search(r"listening on (\S+)", log.read_text())
        assert url, log.read_text()
        token = (state / "token").read_text().strip()
        client = httpx.Client(base_url=url.group(1), timeout=30,
                              headers={"authorization": f"Bearer {token}"})
        yield {"env": env, "log": log, "client": client, "manifests": manifests}
        client.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _lines(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if "match no tool" in line]


def test_the_daemon_and_check_live_name_every_glob_that_matches_no_tool(daemon) -> None:
    env, log, client = daemon["env"], daemon["log"], daemon["client"]
    wrong = ["$.permissions.rules[0].action", '$.rate_limits["fetch_*"]',
             "$.tools.overrides.git_git_status", "$.profiles.coding.exclude[0]"]
    _wait(lambda: _lines(log), "the start's log line")
    assert len(_lines(log)) == 1
    assert all(path in _lines(log)[0] for path in wrong)
    assert "exclude[1]" not in _lines(log)[0]  # `deploy` is a tool

    report = client.get("/v1/health").json()
    assert report["status"] == "degraded"
    assert sorted(u["path"] for u in report["unmatched_globs"]) == sorted(wrong)
    rule = next(u for u in report["unmatched_globs"] if "rules" in u["path"])
    assert "'git_git_commit' matches no tool" in rule["message"]
    assert "git_commit" in rule["hint"]
    health = run_cli("health", env=env)
    assert health.returncode == 1
    assert "permission rule (ask) 'git_git_commit' matches no tool" in health.stdout

    checked = run_cli("check", "--live", str(daemon["manifests"]), env=env)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert checked.stdout.count("warning: ") == len(wrong)
    assert "4 glob(s) matching no tool" in checked.stdout
    offline = run_cli("check", str(daemon["manifests"]), env=env)
    assert offline.returncode == 0, offline.stdout

    (daemon["manifests"] / "agents.toml").write_text(RIGHT)
    _wait(lambda: not client.get("/v1/health").json()["unmatched_globs"], "the reload")
    assert client.get("/v1/health").json()["status"] == "ok"
    assert len(_lines(log)) == 1  # a clean reload adds no line
    assert run_cli("check", "--live", str(daemon["manifests"]), env=env).returncode == 0
    # the rule now names the tool: it asks instead of running unasked
    snapshot = client.post("/v1/snapshots", json={"session_id": "s"}).json()["id"]
    asked = client.post(f"/v1/snapshots/{snapshot}/calls", headers={"prefer": "respond-async"},
                        json={"name": "git_commit", "input": {},
                              "context": {"session_id": "s", "agent": "a", "message_id": "m",
                                          "call_id": "c1"}})
    assert asked.status_code == 202
    _wait(lambda: client.get("/v1/permissions").json()["pending"], "the ask")
    assert client.get("/v1/permissions").json()["pending"][0]["action"] == "git_commit"


def test_check_live_without_a_daemon_says_so(tmp_path: Path) -> None:
    (tmp_path / "a.toml").write_text(TOOLS)
    checked = run_cli("check", "--live", str(tmp_path / "a.toml"),
                      env=sidecar_env(tmp_path / "state"))
    assert checked.returncode == 3
    assert "no daemon runs on" in checked.stderr and "Traceback" not in checked.stderr
