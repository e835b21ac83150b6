"""`sidecar add` into a running `sidecar serve`: servers found in a registry served on
127.0.0.1 (tests/cli/registry_app.py, the real API's shapes) and in a catalog file are
installed while the daemon runs, which starts them live: the published npm server-everything
through `npx -y` and the PyPI mcp-server-time through `uvx`, both sandboxed (`sandbox = true`,
as `sidecar add` writes: the daemon fetches each package into the entry's own cache first),
and a remote (the SDK test server over streamable HTTP) with a header secret. Each answers a
call; the secrets reach the server process and never the manifest; `sidecar remove` takes an
entry away live."""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.bridges.helpers import HttpServers
from tests.cli.registry_app import EVERYTHING_VERSION, ServedRegistry, documents
from tests.hardening.daemon_process import run_cli, serving, sidecar_env

TIME = "io.github.modelcontextprotocol/time"


@pytest.fixture(scope="module")
def remote() -> Iterator[str]:
    """host:port of the remote (the SDK test server, streamable HTTP at /mcp)."""
    servers = HttpServers()
    try:
        url, _ = servers.start_testserver("http")
        yield url.removeprefix("http://").removesuffix("/mcp")
    finally:
        servers.close()


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.1)
    return value


def call(client: httpx.Client, name: str, payload: dict[str, Any]) -> dict[str, Any]:
    """One call of `name` in the first snapshot that lists it."""
    snapshot = wait_for(lambda: (s := client.post("/v1/snapshots", json={"session_id": "s"})
                                 .json()) and name in {d["name"] for d in s["definitions"]}
                        and s["id"], f"{name} listed")
    call_id = uuid.uuid4().hex
    answer = client.post(f"/v1/snapshots/{snapshot}/calls", json={
        "name": name, "input": payload,
        "context": {"session_id": "s", "agent": "a", "message_id": call_id,
                    "call_id": call_id}})
    body: dict[str, Any] = answer.json()
    assert body["status"] == "completed", body
    return body


def holds(pid: int, name: str, value: str) -> bool:
    """Whether the process `pid` or one of its children has `name=value` in its environment
    (npx and uvx run the server as their child)."""
    root = psutil.Process(pid)
    for proc in [root, *root.children(recursive=True)]:
        try:
            if proc.environ().get(name) == value:
                return True
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return False


def add(env: dict[str, str], manifests: Path, *args: str) -> None:
    """`sidecar add ARGS --yes` into the daemon's directory: package entries say
    `sandbox = true`, so the daemon prepares npx's and uvx's caches and starts them sandboxed."""
    added = run_cli("add", *args, "--yes", "--manifests", str(manifests), env=env)
    assert added.returncode == 0, added.stderr
    written = "".join(p.read_text() for p in manifests.glob("*.toml"))
    assert written.count("sandbox = true") >= 1, written


def offline_catalog(path: Path, remote: str) -> Path:
    """The registry's servers as a catalog file, mcp-server-time with the runtime argument
    `--offline` (as a publisher writes one, `runtimeArguments`): the daemon's preparation
    leaves it out (it downloads, with the daemon's own proxy and CA settings), the sandboxed
    uvx runs offline anyway."""
    entries = documents(remote)
    for entry in entries:
        if entry["server"]["name"] == TIME:
            entry["server"]["packages"][0]["runtimeArguments"] = [
                {"type": "positional", "value": "--offline"}]
    path.write_text(json.dumps({"servers": entries}))
    return path


def test_added_servers_start_live_and_remove_stops_them(tmp_path: Path, remote: str) -> None:
    manifests, state = tmp_path / "manifests", tmp_path / "state"
    manifests.mkdir()
    bin_dir = str(Path(sys.executable).parent)  # uvx (the test extra's `uv`), as a user's PATH
    env = sidecar_env(state, manifests, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    catalog = offline_catalog(tmp_path / "catalog.json", remote)
    with ServedRegistry(remote) as registry, serving(state, env=env) as daemon, \
            httpx.Client(base_url=daemon.url, timeout=60,
                         headers={"authorization": f"Bearer {daemon.token}"}) as client:

        def server(name: str) -> dict[str, Any] | None:
            found: dict[str, Any] | None = client.get("/v1/health").json()["servers"].get(name)
            return found

        def ready(name: str) -> dict[str, Any]:
            try:
                return wait_for(lambda: (s := server(name)) and s["state"] == "ready" and s,
                                f"{name} ready")
            except AssertionError:
                report = client.get("/v1/health").json()
                raise AssertionError(f"{name}: {report['servers'].get(name)}, reload problems "
                                     f"{report['reload_problems']}") from None

        add(env, manifests, "everything", "--registry", registry.url)
        everything = ready("everything")
        assert everything["sandbox"]["network"] == "none" and everything["preparing"] is None
        assert psutil.Process(everything["pid"]).name() == "bwrap"
        echoed = call(client, "everything_echo", {"message": "from the registry"})
        assert echoed["content"][0]["text"] == "Echo: from the registry"

        add(env, manifests, TIME, "--registry", str(catalog),
            "--secret", "TIME_API_KEY=tk-live-0123")
        clock = ready("time")
        assert clock["sandbox"]["network"] == "none"
        assert psutil.Process(clock["pid"]).name() == "bwrap"
        now = call(client, "time_get_current_time", {"timezone": "UTC"})
        assert '"timezone": "UTC"' in now["content"][0]["text"]
        assert holds(clock["pid"], "TIME_API_KEY", "tk-live-0123")

        add(env, manifests, "com.example/weather", "--registry", registry.url,
            "--secret", "token=wx-live-4567")
        ready("weather")
        assert call(client, "weather_echo", {"text": "hi"})["status"] == "completed"

        written = "".join(p.read_text() for p in manifests.glob("*.toml"))
        assert "tk-live-0123" not in written and "wx-live-4567" not in written
        assert f"server-everything@{EVERYTHING_VERSION}" in written
        assert client.get("/v1/health").json()["reload_problems"] == []

        removed = run_cli("remove", "everything", env=env)
        assert removed.returncode == 0, removed.stderr
        wait_for(lambda: server("everything") is None, "everything removed")
        wait_for(lambda: not psutil.pid_exists(everything["pid"])
                 or psutil.Process(everything["pid"]).status() == psutil.STATUS_ZOMBIE,
                 "the npx process gone", timeout=30)
        snapshot = client.post("/v1/snapshots", json={"session_id": "s"}).json()
        names = {d["name"] for d in snapshot["definitions"]}
        assert "everything_echo" not in names and "time_get_current_time" in names
