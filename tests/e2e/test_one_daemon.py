"""One daemon per state directory: `sidecar stdio` clients and CLI commands attach to it.

Real processes throughout: the Python `mcp` client launches `sidecar stdio` over pipes, the
CLI runs as a subprocess, the upstream is the bridge tests' SDK server, which appends a
"spawned" event (with its pid) to a file each time a process of it starts.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters

from tests.daemons import daemon_pid, stop_daemon

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "tests" / "bridges" / "servers" / "testserver.py"
SIDECAR = [sys.executable, "-m", "sidecar.cli"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the processes under test pick their own loop


@pytest.fixture
def setup(tmp_path: Path) -> Any:
    manifests = tmp_path / "m"
    manifests.mkdir()
    events = tmp_path / "events.jsonl"
    (manifests / "up.json").write_text(json.dumps({"mcpServers": {"up": {
        "command": sys.executable, "args": [str(SERVER), "--events", str(events)]}}}))
    state = tmp_path / "state"
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", str(tmp_path)),
           "SIDECAR_STATE_DIR": str(state), "SIDECAR_MANIFESTS": str(manifests),
           "SIDECAR_IDLE_EXIT": "120"}
    try:
        yield {"state": state, "manifests": manifests, "events": events, "env": env,
               "tmp": tmp_path}
    finally:
        stop_daemon(state)


def cli(*args: str, env: dict[str, str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SIDECAR, *args], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env=env, check=False, **kwargs)


def spawned(events: Path) -> list[int]:
    lines = events.read_text().splitlines() if events.exists() else []
    return [e["pid"] for e in map(json.loads, lines) if e["event"] == "spawned"]


async def echo(client: Client, text: str) -> str:
    """`up_echo` once the upstream's tools are listed (they appear when it is ready)."""
    with anyio.fail_after(60):
        for _ in range(100_000):
            if "up_echo" in [t.name for t in (await client.list_tools()).tools]:
                break
            await anyio.sleep(0.1)
    result = await client.call_tool("up_echo", {"text": text})
    assert not result.is_error, result.content
    return str(result.content[0].text)  # type: ignore[union-attr]


async def test_three_stdio_clients_and_the_cli_share_one_daemon_and_one_upstream(setup):
    params = StdioServerParameters(command=sys.executable, args=["-m", "sidecar.cli", "stdio"],
                                   cwd=str(ROOT), env=setup["env"])
    clients: dict[int, Client] = {}
    close = {i: anyio.Event() for i in range(3)}
    done = {i: anyio.Event() for i in range(3)}
    ready = {i: anyio.Event() for i in range(3)}
    eras = ["legacy", "2026-07-28", "legacy"]

    async def hold(i: int) -> None:
        try:
            async with Client(params, mode=eras[i], cache=None,
                              read_timeout_seconds=60) as client:
                clients[i] = client
                ready[i].set()
                await close[i].wait()
        finally:
            done[i].set()

    async with anyio.create_task_group() as tg:
        for i in range(3):
            tg.start_soon(hold, i)
        with anyio.fail_after(120):
            for i in range(3):
                await ready[i].wait()
        for i in range(3):
            assert await echo(clients[i], f"client {i}") == f"client {i}"

        call = cli("call", "up_echo", "--input", '{"text": "from the cli"}', env=setup["env"])
        assert call.returncode == 0, call.stderr
        assert call.stdout.strip() == "from the cli"
        health = cli("health", "--json", env=setup["env"])
        report = json.loads(health.stdout)
        daemon = report["daemon"]
        assert daemon["pid"] == daemon_pid(setup["state"])
        assert daemon["manifests"] == [str(setup["manifests"].resolve())]
        assert daemon["state_dir"] == str(setup["state"].resolve())
        assert report["servers"]["up"]["state"] == "ready"
        plain = cli("health", env=setup["env"])
        assert f"daemon: pid {daemon['pid']}" in plain.stdout, plain.stdout

        close[0].set()
        await done[0].wait()
        for i in (1, 2):
            assert await echo(clients[i], f"still {i}") == f"still {i}"
        assert spawned(setup["events"]) == [report["servers"]["up"]["pid"]]  # one, not three
        for i in (1, 2):
            close[i].set()

    for name in ("daemon.sock", "stdio.sock"):
        mode = (setup["state"] / name).stat().st_mode
        assert stat.S_ISSOCK(mode) and mode & 0o777 == 0o600, oct(mode)
    # the daemon outlives its clients (until --idle-exit)
    os.kill(daemon["pid"], 0)


def test_other_manifests_and_a_second_daemon_are_refused_naming_the_running_one(setup):
    started = cli("tools", env=setup["env"])
    assert started.returncode == 0, started.stderr
    assert "started the daemon pid" in started.stderr
    pid = daemon_pid(setup["state"])
    other = setup["tmp"] / "other"
    other.mkdir()
    env = {**setup["env"], "SIDECAR_MANIFESTS": str(other)}
    refused = cli("call", "up_echo", "--input", "{}", env=env)
    assert refused.returncode == 2
    assert f"daemon pid {pid}" in refused.stderr and str(setup["manifests"].resolve()) in \
        refused.stderr and str(other.resolve()) in refused.stderr, refused.stderr
    stdio = cli("stdio", env=env, input="")
    assert stdio.returncode == 2 and f"daemon pid {pid}" in stdio.stderr, stdio.stderr
    # naming no manifests at all attaches to whatever runs
    env.pop("SIDECAR_MANIFESTS")
    anything = cli("tools", "--json", env=env)
    assert anything.returncode == 0, anything.stderr
    assert daemon_pid(setup["state"]) == pid
    # a second daemon on the state: one line that names the first, and nothing started
    second = cli("serve", "--port", "0", env=setup["env"])
    assert second.returncode == 4  # EXIT_STATE_IN_USE
    lines = [line for line in second.stderr.splitlines() if line.startswith("sidecar:")]
    assert len(lines) == 1 and "another sidecar daemon is running on" in lines[0]
    assert f"daemon pid {pid}" in lines[0], second.stderr
    assert len(spawned(setup["events"])) == 1


def test_an_idle_daemon_started_on_demand_exits_and_stops_its_upstream(setup):
    env = {**setup["env"], "SIDECAR_IDLE_EXIT": "1"}
    started = cli("tools", env=env)
    assert started.returncode == 0, started.stderr
    upstream = spawned(setup["events"])
    assert upstream, "the daemon never started its upstream"
    # One idle second may be over before this reads daemon.json (on a loaded machine the CLI
    # takes that long to exit): then the daemon is gone already, and so is its pid file.
    pid = daemon_pid(setup["state"])
    deadline = time.monotonic() + 60
    while _alive([pid] if pid is not None else []) or (setup["state"] / "daemon.json").exists():
        if time.monotonic() > deadline:
            pytest.fail("the idle daemon did not exit")
        time.sleep(0.1)
    assert not (setup["state"] / "stdio.sock").exists()
    assert spawned(setup["events"]) == upstream  # nothing started it again
    while _alive(upstream):
        if time.monotonic() > deadline:
            pytest.fail(f"the idle daemon's upstream {upstream} outlived it")
        time.sleep(0.1)


def _alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        alive.append(pid)
    return alive


def test_sigterm_stops_an_on_demand_daemon_and_its_upstream(setup):
    assert cli("tools", env=setup["env"]).returncode == 0
    pid = daemon_pid(setup["state"])
    assert pid is not None
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 60
    while _alive([pid]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive([pid]) and not _alive(spawned(setup["events"]))


def test_sidecar_stop_stops_the_daemon_and_its_upstream_and_says_which(setup):
    assert cli("tools", env=setup["env"]).returncode == 0
    pid = daemon_pid(setup["state"])
    stopped = cli("stop", env=setup["env"])
    assert stopped.returncode == 0
    assert f"sidecar: stopped the daemon pid {pid} on " in stopped.stderr, stopped.stderr
    assert not _alive([pid]) and not _alive(spawned(setup["events"]))  # gone when it returns
    again = cli("stop", env=setup["env"])
    assert again.returncode == 0 and "no daemon runs on" in again.stderr
