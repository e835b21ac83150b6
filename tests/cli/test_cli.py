"""The CLI end to end, in subprocesses: `sidecar serve` and clients talking to it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

SIDECAR = [sys.executable, "-m", "sidecar.cli"]


def run(*args: str, env: dict[str, str] | None = None, timeout: float = 60):
    return subprocess.run([*SIDECAR, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, check=False)


@pytest.fixture
def daemon(tmp_path):
    state = tmp_path / "state"
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    env = {**os.environ, "SIDECAR_STATE_DIR": str(state), "SIDECAR_MANIFESTS": str(manifests)}
    env.pop("SIDECAR_TOKEN", None)
    env.pop("SIDECAR_URL", None)
    proc = subprocess.Popen([*SIDECAR, "serve", "--port", "0"], env=env,
                            stderr=subprocess.PIPE, text=True)
    lines = []
    try:
        while True:
            line = proc.stderr.readline()
            assert line, f"serve exited early: {''.join(lines)}"
            lines.append(line)
            if "listening on" in line:
                url = line.split("listening on ")[1].strip()
                break
        yield {"url": url, "state": state, "env": env, "stderr": lines, "proc": proc}
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        proc.stderr.close()


def test_serve_names_its_new_token_and_clients_use_the_running_daemon(daemon):
    token_file = daemon["state"] / "token"
    assert oct(token_file.stat().st_mode & 0o777) == "0o600"
    token = token_file.read_text().strip()
    said = "".join(daemon["stderr"])  # a pipe: the path is printed, never the token
    assert f"new bearer token in {token_file}" in said and token not in said
    info = json.loads((daemon["state"] / "daemon.json").read_text())
    assert info["url"] == daemon["url"]
    env = {"SIDECAR_STATE_DIR": str(daemon["state"])}  # finds daemon.json and the token
    tools = run("tools", "--json", env=env)
    assert tools.returncode == 0, tools.stderr
    assert "managed_read" in [t["name"] for t in json.loads(tools.stdout)]
    formatted = run("tools", "--format", "anthropic", env=env)
    assert json.loads(formatted.stdout)[0]["input_schema"]["type"] == "object"
    health = run("health", "--json", env=env)
    assert health.returncode == 0 and json.loads(health.stdout)["status"] == "ok"
    bad = run("call", "managed_read", "--input", '{"ref": "m_' + "a" * 26 + '"}', env=env)
    assert bad.returncode == 1 and "tool_failure" in bad.stderr
    garbage = run("call", "managed_read", "--input", "{not json", env=env)
    assert garbage.returncode == 2


def test_wrong_token_and_unreachable_daemon_exit_codes(daemon, tmp_path):
    env = {"SIDECAR_URL": daemon["url"], "SIDECAR_TOKEN": "wrong"}
    refused = run("tools", env=env)
    assert refused.returncode == 2 and "401" in refused.stderr
    gone = run("tools", env={"SIDECAR_URL": "http://127.0.0.1:9", "SIDECAR_TOKEN": "x"})
    assert gone.returncode == 3 and "unreachable" in gone.stderr


def test_embedded_mode_and_managed_read(tmp_path):
    env = {"SIDECAR_STATE_DIR": str(tmp_path / "s"), "SIDECAR_MANIFESTS": ""}
    listing = run("tools", "--embedded", env=env)
    assert listing.returncode == 0 and "managed_read" in listing.stdout
    missing = run("managed", "read", "--embedded", "m_" + "b" * 26, env=env)
    assert missing.returncode == 1 and "error (tool_failure)" in missing.stderr
    invalid = run("managed", "read", "--embedded", "../../etc/passwd", env=env)
    assert invalid.returncode == 1


def test_serve_stops_cleanly_on_sigterm(daemon):
    proc = daemon["proc"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert not Path(daemon["state"] / "daemon.json").exists()


def test_progress_of_a_remote_call_and_a_manifest_added_while_serving(daemon):
    manifests = daemon["state"].parent / "manifests"
    script = "import time\\nfor i in range(4):\\n    print('tick', i)\\n    time.sleep(0.4)"
    (manifests / "ticker.toml").write_text(f'''
[tools.ticker]
kind = "command"
description = "prints a few lines slowly"
input = {{ type = "object", properties = {{}} }}
argv = ["{sys.executable}", "-u", "-c", "{script}"]
progress = true
''')
    env = {"SIDECAR_STATE_DIR": str(daemon["state"])}
    for _ in range(100):  # live reload picks the new manifest up
        listing = run("tools", "--json", env=env)
        if "ticker" in listing.stdout:
            break
        time.sleep(0.1)
    assert "ticker" in listing.stdout
    call = run("call", "ticker", "--progress", env=env)
    assert call.returncode == 0, call.stderr
    assert "tick 3" in call.stdout
    assert '"line"' in call.stderr and "tick" in call.stderr  # progress snapshots were shown
    # not a terminal: one plain line per snapshot, no escape codes
    assert "\x1b" not in call.stderr and "\r" not in call.stderr
    assert any(line.startswith("progress: {") for line in call.stderr.splitlines())


def _in_subprocess(script: str, stdin: int | None = None) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, check=False, stdin=stdin)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_freezing_the_startup_heap_leaves_only_later_objects_to_the_collector():
    found = _in_subprocess("""
import gc, json
import sidecar.daemon.daemon
before = len(gc.get_objects())
sidecar.daemon.daemon.freeze_startup_heap()
frozen, left = gc.get_freeze_count(), len(gc.get_objects())
cycle = []; cycle.append(cycle); del cycle  # garbage made afterwards is still found
print(json.dumps({"before": before, "frozen": frozen, "left": left, "collected": gc.collect()}))
""")
    assert found["before"] > 50_000  # what a full collection walked before
    assert found["frozen"] >= found["before"] - 100
    assert found["left"] < 100
    assert found["collected"] >= 1


DAEMON_COMMANDS = [(["stdio", "--standalone"], "stdio"), (["serve"], "serve"),
                   (["daemon"], "serve")]


@pytest.mark.parametrize(("argv", "body"), DAEMON_COMMANDS)
def test_the_daemon_commands_freeze_the_startup_heap_before_their_loop_runs(argv, body, tmp_path):
    """`main` with the daemon's body replaced by one that reports what the collector sees
    (a state directory of its own: the cases run at once on other workers)."""
    argv = [*argv, "--state-dir", str(tmp_path / "state")]
    found = _in_subprocess(f"""
import gc, json
import sidecar.cli.commands as cli
seen = {{}}
async def body(**kwargs):
    seen["frozen"] = gc.get_freeze_count()
cli.{body} = body
assert cli.main({argv!r}) == cli.EXIT_OK
print(json.dumps(seen))
""")
    assert found["frozen"] > 50_000


def test_a_daemon_without_http_tools_does_not_import_httpx(tmp_path):
    """httpx loads its command line's libraries (rich, click, pygments) on import, ~40 ms of
    a daemon's start: only an http tool, or a client of a running daemon, imports it."""
    (tmp_path / "http.toml").write_text(
        '[tools.fetch]\nkind = "http"\ndescription = "a page"\n'
        'input = { type = "object", properties = {} }\n'
        'request = { method = "GET", url = "http://127.0.0.1:9/" }\n')
    found = _in_subprocess(f"""
import asyncio, json, sys
from pathlib import Path
from typing import Any
import sidecar.cli.commands, sidecar.serve.mcp_facade
from sidecar import Location
root = Path({str(tmp_path)!r})
async def names(manifests):
    async with Location.open(root, state_dir=root / "state", manifests=manifests,
                             entry_point_plugins=False) as location:
        return sorted(location.snapshot().names), "httpx" in sys.modules
seen = {{"default": asyncio.run(names([{str(Path(__file__).parents[2] / "manifests")!r}]))}}
seen["http"] = asyncio.run(names([str(root / "http.toml")]))
print(json.dumps(seen))
""")
    assert found["default"] == [["managed_read", "utc_now"], False]
    assert found["http"] == [["fetch", "managed_read"], True]


@pytest.mark.parametrize(("argv", "body"), DAEMON_COMMANDS)
def test_the_daemon_commands_spawn_their_stdio_servers_before_importing_the_sdk(
    argv, body, tmp_path
):
    """So that the servers start on another core during the daemon's imports (most of its
    start); the pool adopts them (tests/bridges/test_prestart.py)."""
    (tmp_path / "m.json").write_text(json.dumps({"mcpServers": {"up": {"command": "true"}}}))
    found = _in_subprocess(f"""
import json, sys
import bridges.prestart
import sidecar.cli.commands as cli
seen = {{}}
def prestart(manifests):
    seen["manifests"] = [str(m) for m in manifests]
    seen["sdk_at_prestart"] = "mcp" in sys.modules
    return 0
bridges.prestart.prestart_servers = prestart
async def body(**kwargs):
    seen["sdk_in_loop"] = "mcp" in sys.modules
cli.{body} = body
assert cli.main({[*argv, "--manifests", str(tmp_path), "--state-dir",
                  str(tmp_path / "state")]!r}) == cli.EXIT_OK
print(json.dumps(seen))
""")
    assert found == {"manifests": [str(tmp_path)], "sdk_at_prestart": False,
                     "sdk_in_loop": True}


def test_sidecar_stdio_stops_prestarted_servers_its_location_did_not_claim(tmp_path):
    """A server spawned ahead for an entry the Location does not start (here: not in its
    manifests at all) is stopped once the Location is open, not left running."""
    (tmp_path / "manifests").mkdir()
    found = _in_subprocess(f"""
import json, os
from bridges.prestart import PRESTARTED, StdioSpec
import sidecar.cli.commands as cli
PRESTARTED.start([StdioSpec("sleep", ("60",), {{}}, None, 1)])
[pid] = PRESTARTED.pids()
code = cli.main(["stdio", "--standalone", "--manifests", {str(tmp_path / "manifests")!r},
                 "--state-dir", {str(tmp_path / "state")!r}])
try:
    os.kill(pid, 0)
    alive = True
except ProcessLookupError:
    alive = False
print(json.dumps({{"code": code, "alive": alive, "waiting": PRESTARTED.waiting}}))
""", stdin=subprocess.DEVNULL)
    assert found == {"code": 0, "alive": False, "waiting": 0}


def test_sidecar_serve_adopts_the_upstream_it_spawned_before_its_imports(tmp_path):
    server = Path(__file__).resolve().parents[1] / "bridges" / "servers" / "testserver.py"
    (tmp_path / "up.json").write_text(json.dumps(
        {"mcpServers": {"up": {"command": sys.executable, "args": [str(server)]}}}))
    env = {**os.environ, "SIDECAR_STATE_DIR": str(tmp_path / "state"),
           "SIDECAR_MANIFESTS": str(tmp_path), "SIDECAR_LOG_LEVEL": "DEBUG"}
    proc = subprocess.Popen([*SIDECAR, "serve", "--port", "0"], env=env,
                            stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    try:
        while not any("listening on" in line for line in lines):
            line = proc.stderr.readline()
            assert line, f"serve exited early: {''.join(lines)}"
            lines.append(line)
        assert any("[up] adopted the server started before the daemon's imports" in line
                   for line in lines), "".join(lines)
        call = run("call", "up_echo", "--input", '{"text": "adopted"}',
                   env={"SIDECAR_STATE_DIR": str(tmp_path / "state")})
        assert call.returncode == 0 and "adopted" in call.stdout, call.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        proc.stderr.close()


def test_managed_read_by_characters_from_the_cli(tmp_path):
    import asyncio

    from sidecar import Location

    async def put() -> str:
        async with Location.open(tmp_path, state_dir=tmp_path / "s") as location:
            return (await location.seam.store.put("x" * 100 + "needle" + "y" * 100)).id

    ref = asyncio.run(put())
    env = {"SIDECAR_STATE_DIR": str(tmp_path / "s"), "SIDECAR_MANIFESTS": ""}
    read = run("managed", "read", ref, "--offset", "1", "--start", "100", "--length", "6",
               env=env)
    assert read.returncode == 0, read.stderr
    assert "characters 100-105; continue with offset=1, start=106" in read.stdout
    assert "needle" in read.stdout and "xneedle" not in read.stdout
