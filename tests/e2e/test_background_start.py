"""A start that never waits for the slowest server: the daemon answers at once, servers come up
in the background, their tools appear with `list_changed` (both protocol eras), and a listing
made before says which servers are still starting.

Real processes: `sidecar stdio` launched by the Python `mcp` client, an upstream that never
answers `initialize` (it writes its pid and sleeps), and the bridge tests' SDK server.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters, types

from tests.daemons import alive, daemon_pid, stop_daemon

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "tests" / "bridges" / "servers" / "testserver.py"
STARTING_KEY = "io.mcp-sidecar/starting"
HANG = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(3600)"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the processes under test pick their own loop


@pytest.fixture
def setup(tmp_path: Path) -> Any:
    manifests = tmp_path / "m"
    manifests.mkdir()
    hang_pid = tmp_path / "hang.pid"
    (manifests / "servers.json").write_text(json.dumps({"mcpServers": {
        "hang": {"command": sys.executable, "args": ["-c", HANG, str(hang_pid)],
                 "timeouts": {"startup": 600}},
        "up": {"command": sys.executable, "args": [str(SERVER)]},
    }}))
    state = tmp_path / "state"
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", str(tmp_path)),
           "SIDECAR_STATE_DIR": str(state), "SIDECAR_MANIFESTS": str(manifests),
           "SIDECAR_IDLE_EXIT": "120"}
    try:
        yield {"state": state, "env": env, "hang_pid": hang_pid}
    finally:
        stop_daemon(state)


async def _starting(client: Client) -> list[str]:
    listed = await client.list_tools()
    return list((listed.meta or {}).get(STARTING_KEY, []))


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_tools_of_a_ready_server_appear_while_another_never_answers(setup, mode):
    changed = anyio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    params = StdioServerParameters(command=sys.executable, args=["-m", "sidecar.cli", "stdio"],
                                   cwd=str(ROOT), env=setup["env"])
    async with Client(params, mode=mode, cache=None, read_timeout_seconds=60,
                      message_handler=on_message) as client:
        # initialize was answered while `hang` has not answered its own
        first = await client.list_tools()
        assert "hang" in (first.meta or {}).get(STARTING_KEY, []), first.meta
        names = [t.name for t in first.tools]
        assert "managed_read" in names
        with anyio.fail_after(60):
            if mode == "legacy":
                while "up_echo" not in names:
                    await changed.wait()
                    changed = anyio.Event()
                    names = [t.name for t in (await client.list_tools()).tools]
            else:
                async with client.listen(tools_list_changed=True) as events:
                    names = [t.name for t in (await client.list_tools()).tools]
                    if "up_echo" not in names:
                        async for _ in events:
                            names = [t.name for t in (await client.list_tools()).tools]
                            if "up_echo" in names:
                                break
        assert "up_echo" in names
        # "up" registers its tools as soon as they are listed, but is ready (and leaves
        # `starting`, in health too) only once its 2026-07-28 listen stream is acknowledged,
        # up to 5 s later (bridges/mcp/supervisor.py LISTEN_ACK_WAIT).
        with anyio.fail_after(60):
            while (starting := await _starting(client)) != ["hang"]:
                assert starting == ["hang", "up"], starting
                await anyio.sleep(0.05)
        echoed = await client.call_tool("up_echo", {"text": "ready"})
        assert echoed.content[0].text == "ready"  # type: ignore[union-attr]

    health = await anyio.run_process([sys.executable, "-m", "sidecar.cli", "health"],
                                     cwd=ROOT, env=setup["env"], check=False)
    out = health.stdout.decode()
    assert health.returncode == 1, out + health.stderr.decode()  # degraded
    assert "hang: starting" in out
    assert "server hang is starting" in out, out


def test_sigterm_while_a_server_is_starting_stops_everything(setup):
    started = subprocess.run([sys.executable, "-m", "sidecar.cli", "health", "--json"],
                             cwd=ROOT, env=setup["env"], capture_output=True, text=True,
                             timeout=120, check=False)
    report = json.loads(started.stdout)
    assert report["servers"]["hang"]["state"] == "starting", report["servers"]
    pid = daemon_pid(setup["state"])
    assert pid is not None
    deadline = time.monotonic() + 60
    while not setup["hang_pid"].exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    hang = int(setup["hang_pid"].read_text())
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 60
    while (alive(pid) or alive(hang)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid) and not alive(hang)
