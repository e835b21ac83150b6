"""Issue 26 item 12: command runs and stdio servers do not outlive the daemon.

kill -9 a real `sidecar serve` while a command runs and an MCP stdio server is up, each with a
grandchild in its process group: the direct children die with the daemon (PR_SET_PDEATHSIG);
the grandchildren are killed when a daemon starts again on the same state directory (the
recorded groups). SIGTERM while a server is still starting stops it (serve and stdio)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx

from tests.hardening.daemon_process import SIDECAR, processes_with, serving, sidecar_env

RAW_SERVER = Path(__file__).resolve().parents[1] / "bridges" / "servers" / "raw_server.py"

FAMILY = f'''
import runpy, subprocess, sys, time
marker, mode = sys.argv[1], sys.argv[2]
# a grandchild in the same process group, as `npx` starts `node`
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", marker + "-grandchild"])
if mode == "server":
    sys.argv = [{str(RAW_SERVER)!r}]
    runpy.run_path({str(RAW_SERVER)!r}, run_name="__main__")
else:  # a command that runs long, or a server that never answers
    print("started", flush=True)
    time.sleep(600)
'''


def _family(tmp_path: Path) -> Path:
    script = tmp_path / "family.py"
    script.write_text(FAMILY)
    return script


def _wait_for(what: str, condition: object, deadline: float = 60) -> None:
    """Poll `condition()` until true; fail naming `what` after `deadline` seconds (a generous
    bound for a loaded machine, not a timing assertion)."""
    end = time.monotonic() + deadline
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < end, f"gave up waiting for {what}"
        time.sleep(0.05)


def test_children_die_with_a_killed_daemon_and_leftovers_are_reaped_at_the_next_start(
    tmp_path: Path,
) -> None:
    script = _family(tmp_path)
    command, server = f"cmd-{uuid.uuid4().hex}", f"srv-{uuid.uuid4().hex}"
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "family.json").write_text(json.dumps({
        "mcpServers": {"fam": {"command": sys.executable, "args": [str(script), server,
                                                                    "server"]}},
        "tools": {"long": {"kind": "command", "description": "runs long",
                           "input": {"type": "object", "properties": {}},
                           "argv": [sys.executable, str(script), command, "command"],
                           "timeout": 600}},
    }))
    state = tmp_path / "state"
    with serving(state, manifests=manifests) as daemon:
        headers = {"authorization": f"Bearer {daemon.token}"}

        def call() -> None:  # ends with an error when the daemon is killed
            context = {"session_id": "s", "agent": "a", "message_id": "m", "call_id": "c1"}
            try:
                with httpx.Client(base_url=daemon.url, headers=headers, timeout=600) as client:
                    snapshot = client.post("/v1/snapshots", json={"session_id": "s"}).json()
                    client.post(f"/v1/snapshots/{snapshot['id']}/calls",
                                json={"name": "long", "input": {}, "context": context})
            except httpx.HTTPError:
                pass

        caller = threading.Thread(target=call)
        caller.start()
        _wait_for("the command and its grandchild",
                  lambda: processes_with(f"{command}\0command")
                  and processes_with(f"{command}-grandchild"))
        _wait_for("the server's grandchild", lambda: processes_with(f"{server}-grandchild"))
        leaders = processes_with(f"{command}\0command") + processes_with(f"{server}\0server")
        grandchildren = (processes_with(f"{command}-grandchild")
                         + processes_with(f"{server}-grandchild"))
        records = list((state / "children").rglob("*-*"))
        assert len([r for r in records if r.is_file()]) == 2, records
        os.kill(daemon.proc.pid, signal.SIGKILL)
        daemon.proc.wait(timeout=30)
        caller.join(timeout=60)
    # the direct children got SIGKILL when the daemon died
    _wait_for("the direct children to die with the daemon",
              lambda: not any(_alive(pid) for pid in leaders))
    # their grandchildren are still running, and recorded
    assert all(_alive(pid) for pid in grandchildren)
    with serving(state, manifests=manifests) as restarted:
        assert not any(_alive(pid) for pid in grandchildren)  # reaped before it listened
        assert any("killed 2 process(es) left behind" in line for line in restarted.stderr)
        own = [p.name for p in (state / "children").glob("*/*")]
        assert own == [f"{restarted.proc.pid}-{_start_ticks(restarted.proc.pid)}"]
    for marker in (command, server):
        assert processes_with(marker) == []


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _start_ticks(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


def _slow_server_manifest(tmp_path: Path, marker: str) -> Path:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "slow.json").write_text(json.dumps({"mcpServers": {"slow": {
        "command": sys.executable, "args": [str(_family(tmp_path)), marker, "never"],
        "timeouts": {"startup": 600},
    }}}))
    return manifests


def test_sigterm_while_serve_starts_stops_the_server_that_is_starting(tmp_path: Path) -> None:
    marker = f"slow-{uuid.uuid4().hex}"
    manifests = _slow_server_manifest(tmp_path, marker)
    proc = subprocess.Popen([*SIDECAR, "serve", "--port", "0"],
                            env=sidecar_env(tmp_path / "state", manifests),
                            stderr=subprocess.PIPE, text=True)
    try:
        _wait_for("the server and its grandchild",
                  lambda: processes_with(f"{marker}\0never")
                  and processes_with(f"{marker}-grandchild"))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stderr is not None
        stderr = proc.stderr.read()
        proc.stderr.close()
    assert "listening on" not in stderr and "Traceback" not in stderr, stderr
    assert processes_with(marker) == []


def test_sigterm_to_a_standalone_sidecar_stdio_stops_its_servers(tmp_path: Path) -> None:
    marker = f"stdio-{uuid.uuid4().hex}"
    manifests = _slow_server_manifest(tmp_path, marker)
    proc = subprocess.Popen([*SIDECAR, "stdio", "--standalone"],
                            env=sidecar_env(tmp_path / "state", manifests),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        _wait_for("the server and its grandchild",
                  lambda: processes_with(f"{marker}\0never")
                  and processes_with(f"{marker}-grandchild"))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            assert pipe is not None
            pipe.close()
    assert processes_with(marker) == []
