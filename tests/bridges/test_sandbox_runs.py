"""Sandboxed stdio servers and command tools, as real processes under real bubblewrap: what
they cannot read, reach or write, their memory limit, the egress proxy, the published
filesystem server (also through `npx -y`), a server through `uvx` (both from the cache the
daemon prepares), and the one-line refusal where bwrap cannot run."""

from __future__ import annotations

import http.server
import json
import logging
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from bridges.manifest.loading import ServerConfig
from bridges.mcp import ServerHealth, ServerPool
from bridges.sandbox import PREPARE_TIMEOUT, PREPARED, PROTECTED
from sidecar import Location, TextContent
from tests.bridges.helpers import ctx
from tests.bridges.manifest_tools_support.location import call, manifest_tools, open_location

pytestmark = pytest.mark.anyio

PROBE = Path(__file__).parent / "servers" / "probe_server.py"
FILESYSTEM = "npm/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js"
REFERENCE_VERSION = "2026.8.31"  # scripts/bootstrap-servers' server-filesystem
TIME_VERSION = "2026.10.19"  # and mcp-server-time
NOTHING: dict[str, Any] = {"type": "object", "properties": {}}


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """A home with an ~/.ssh key, a state dir with a token, a writable and a read-only dir."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("PRIVATE KEY")
    monkeypatch.setenv("HOME", str(home))
    state = tmp_path / "state"  # the `location` fixture's state directory
    state.mkdir(exist_ok=True)
    (state / "token").write_text("SECRET-TOKEN")
    PROTECTED.protect(state)  # as the daemon does for its state directory
    out, seen = tmp_path / "out", tmp_path / "seen"
    out.mkdir()
    seen.mkdir()
    (seen / "note.txt").write_text("visible")
    yield {"home": home, "state": state, "out": out, "seen": seen, "tmp": tmp_path}
    PROTECTED.release(state)


@pytest.fixture
def listening() -> Iterator[int]:
    """A port on 127.0.0.1 that answers HTTP (as the daemon's would)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


class _Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: Any) -> None:
        pass


def _probe_server(world: dict[str, Path], **sandbox: Any) -> ServerConfig:
    # `read` names the state directory itself: it is masked anyway
    table = {"read": [str(PROBE.parent), str(world["seen"]), str(world["state"])],
             "write": [str(world["out"])], **sandbox}
    return ServerConfig.model_validate({
        "command": sys.executable, "args": [str(PROBE)], "protocol": "legacy",
        "sandbox": table})


async def _probe(location: Location, action: str, target: str) -> str:
    outcome = await location.snapshot().execute(
        "p_probe", {"action": action, "target": target}, ctx())
    assert outcome.status == "completed", outcome.error
    (item,) = outcome.content
    assert isinstance(item, TextContent)
    return item.text


async def test_a_sandboxed_server_sees_only_what_it_was_given(
    location: Location, world: dict[str, Path], listening: int
) -> None:
    async with ServerPool({"p": _probe_server(world, memory_mb=256)}, location.tools) as pool:
        health = pool.health()["p"]
        assert health.state == "ready", health.last_error
        assert health.to_json()["sandbox"]["write"] == [str(world["out"])]
        assert (await _probe(location, "read", str(world["seen"] / "note.txt"))) == (
            "ok: visible")
        token = await _probe(location, "read", str(world["state"] / "token"))
        assert token.startswith("error: FileNotFoundError"), token
        key = await _probe(location, "read", str(world["home"] / ".ssh" / "id_ed25519"))
        assert key.startswith("error: FileNotFoundError"), key
        port = await _probe(location, "connect", f"127.0.0.1:{listening}")
        assert port.startswith("error:"), port
        assert (await _probe(location, "write", str(world["out"] / "w.txt"))) == "ok: written"
        assert (world["out"] / "w.txt").read_text() == "probe"
        refused = await _probe(location, "write", str(world["seen"] / "w.txt"))
        assert "Read-only file system" in refused, refused
        assert not (world["seen"] / "w.txt").exists()
        env = json.loads((await _probe(location, "env", "")).removeprefix("ok: "))
        assert set(env) <= {"PATH", "HOME", "TMPDIR", "PWD", "LC_CTYPE"}, env
        memory = await _probe(location, "allocate", "512")
        assert memory.startswith("error: MemoryError"), memory


async def test_a_server_over_its_memory_limit_fails_with_the_reason(
    location: Location, world: dict[str, Path]
) -> None:
    config = ServerConfig.model_validate({
        "command": sys.executable, "args": ["-c", "x = bytearray(400 << 20)"],
        "sandbox": {"memory_mb": 128}, "timeouts": {"startup": 10}})
    async with ServerPool({"p": config}, location.tools) as pool:
        health = pool.health()["p"]
        assert health.state != "ready"
        assert "MemoryError" in (health.last_error or ""), health.last_error


async def test_the_published_filesystem_server_works_sandboxed(
    location: Location, world: dict[str, Path], published_servers: Path
) -> None:
    script = published_servers / FILESYSTEM
    if not script.exists():
        pytest.fail("server-filesystem is not installed: run scripts/bootstrap-servers",
                    pytrace=False)
    root = world["out"]
    config = ServerConfig.model_validate({
        "command": "node", "args": [str(script), str(root)],
        "sandbox": {"read": [str(published_servers / "npm")], "write": [str(root)]}})
    async with ServerPool({"fs": config}, location.tools) as pool:
        health = pool.health()["fs"]
        assert health.state == "ready", health.last_error
        snapshot = location.snapshot()
        wrote = await snapshot.execute(
            "fs_write_file", {"path": str(root / "a.txt"), "content": "hello"}, ctx())
        assert wrote.status == "completed", wrote.error
        assert (root / "a.txt").read_text() == "hello"
        read = await snapshot.execute("fs_read_text_file", {"path": str(root / "a.txt")}, ctx())
        assert read.status == "completed", read.error
        assert "hello" in read.content[0].text  # type: ignore[union-attr]


class _Started:
    """`on_health` of a pool of one server: set once it left `starting`. A first preparation
    (a download) may outlast timeouts.startup, and the pool then stops waiting for it."""

    def __init__(self) -> None:
        self.event = anyio.Event()

    def __call__(self, key: str, health: ServerHealth) -> None:
        if health.state != "starting":
            self.event.set()

    async def ready(self, pool: ServerPool, key: str) -> ServerHealth:
        with anyio.fail_after(PREPARE_TIMEOUT):
            await self.event.wait()
        health = pool.health()[key]
        assert health.state == "ready", health.last_error
        return health


@pytest.fixture(scope="module")
def prepared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("prepared")


@pytest.fixture
def prepared_caches(location: Location, prepared_dir: Path) -> Path:
    """Where npx and uvx entries get their caches prepared: kept for the module (each test
    runs on two event loops), not in each location's state directory as the daemon does."""
    PREPARED.use(prepared_dir)
    return prepared_dir


async def test_npx_starts_sandboxed_from_the_cache_prepared_for_it(
    location: Location, world: dict[str, Path], prepared_caches: Path
) -> None:
    """`npx -y PKG@VERSION` (what `sidecar add` writes): the daemon fetches the package into
    the entry's own npm cache first (npm, no package code), then npx runs it offline; the
    server may serve the whole temporary directory, the token in it stays out of reach."""
    root = world["tmp"]
    config = ServerConfig.model_validate({
        "command": "npx",
        "args": ["-y", f"@modelcontextprotocol/server-filesystem@{REFERENCE_VERSION}", str(root)],
        "sandbox": {"read": [str(root)]}})
    started = _Started()
    async with ServerPool({"fs": config}, location.tools, on_health=started) as pool:
        health = await started.ready(pool, "fs")
        assert health.preparing is None
        snapshot = location.snapshot()
        note = await snapshot.execute(
            "fs_read_text_file", {"path": str(world["seen"] / "note.txt")}, ctx())
        assert note.status == "completed", note.error
        assert "visible" in note.content[0].text  # type: ignore[union-attr]
        token = await snapshot.execute(
            "fs_read_text_file", {"path": str(world["state"] / "token")}, ctx())
        shown = token.error.message if token.error else str(token.content)
        assert "SECRET-TOKEN" not in shown and "ENOENT" in shown, shown
    prepared = PREPARED.entry_dir("fs")
    assert prepared.parent == prepared_caches
    assert (prepared / "prepared.json").is_file() and (prepared / "npm" / "_npx").is_dir()


async def test_uvx_starts_sandboxed_from_the_cache_prepared_for_it(
    location: Location, world: dict[str, Path], prepared_caches: Path
) -> None:
    """`uvx --from PKG==VERSION python probe_server.py`: the environment uv builds (once,
    outside, `--no-build`) in the entry's own cache, the interpreter uv chose, offline
    inside; the probe running in it still cannot read the token or ~/.ssh."""
    uvx = str(Path(sys.executable).with_name("uvx"))
    config = ServerConfig.model_validate({
        "command": uvx, "args": ["--from", f"mcp-server-time=={TIME_VERSION}", "python",
                                 str(PROBE)],
        "protocol": "legacy", "sandbox": {"read": [str(PROBE.parent), str(world["state"])]}})
    started = _Started()
    async with ServerPool({"p": config}, location.tools, on_health=started) as pool:
        await started.ready(pool, "p")
        token = await _probe(location, "read", str(world["state"] / "token"))
        assert token.startswith("error: FileNotFoundError"), token
        key = await _probe(location, "read", str(world["home"] / ".ssh" / "id_ed25519"))
        assert key.startswith("error: FileNotFoundError"), key
        env = json.loads((await _probe(location, "env", "")).removeprefix("ok: "))
        assert env["UV_OFFLINE"] == "1" and env["UV_CACHE_DIR"] == "/run/sidecar/cache/uv", env
    assert (prepared_caches / PREPARED.entry_dir("p").name / "uv").is_dir()


async def test_a_command_through_uvx_runs_from_its_own_prepared_cache(
    tmp_path: Path, world: dict[str, Path], prepared_dir: Path
) -> None:
    """A `command` tool prepares at its first call, in a cache of its own (`tool:NAME`)."""
    uvx = str(Path(sys.executable).with_name("uvx"))
    script = ("import os, sys, mcp_server_time; print(mcp_server_time.__name__); "
              "print('token', os.path.exists(sys.argv[1]))")
    entries = {"peek": {"kind": "command", "description": "d", "input": NOTHING,
                        "argv": [uvx, "--from", f"mcp-server-time=={TIME_VERSION}", "python",
                                 "-c", script, str(world["state"] / "token")],
                        "sandbox": {"read": [str(world["state"])]}}}
    (tmp_path / "loc").mkdir()
    async with open_location(tmp_path / "loc") as location:
        PREPARED.use(prepared_dir)
        async with manifest_tools(location, entries):
            outcome = await call(location, "peek", {})
    assert outcome.status == "completed", outcome.error
    text = outcome.content[0].text  # type: ignore[union-attr]
    assert text.split() == ["mcp_server_time", "token", "False"], text
    assert (PREPARED.entry_dir("tool:peek") / "uv").is_dir()


def _sh(script: str, **sandbox: Any) -> dict[str, Any]:
    return {"kind": "command", "description": "d", "input": NOTHING,
            "argv": ["/bin/sh", "-c", script], "sandbox": sandbox or True}


async def test_a_sandboxed_command_is_contained(
    tmp_path: Path, world: dict[str, Path], listening: int
) -> None:
    script = (
        f"cat {world['state']}/token; echo token=$?; "
        f"cat {world['home']}/.ssh/id_ed25519; echo key=$?; "
        f"cat {world['seen']}/note.txt; echo; "
        f"curl -s -m 5 http://127.0.0.1:{listening}/; echo port=$?; "
        f"echo x > {world['out']}/w.txt; echo write_out=$?; "
        f"echo x > {world['seen']}/w.txt; echo write_seen=$?; "
        "echo SIDECAR_TOKEN=${SIDECAR_TOKEN:-unset}")
    # `read` names the state directory itself: it is masked anyway
    entries = {"probe": _sh(script, read=[str(world["seen"]), str(world["state"])],
                            write=[str(world["out"])])}
    (tmp_path / "loc").mkdir()
    async with open_location(tmp_path / "loc") as location:
        async with manifest_tools(location, entries):
            outcome = await call(location, "probe", {})
    assert outcome.status == "completed", outcome.error
    text = "\n".join(c.text for c in outcome.content if isinstance(c, TextContent))
    assert "SECRET-TOKEN" not in text and "token=1" in text, text
    assert "PRIVATE KEY" not in text and "key=1" in text, text
    assert "visible" in text
    assert "port=7" in text, text  # curl: could not connect
    assert "write_out=0" in text and "write_seen=2" in text, text
    assert (world["out"] / "w.txt").exists() and not (world["seen"] / "w.txt").exists()
    assert "SIDECAR_TOKEN=unset" in text


async def test_a_command_over_its_memory_limit_names_it(tmp_path: Path) -> None:
    entries = {"hog": {"kind": "command", "description": "d", "input": NOTHING,
                       "argv": [sys.executable, "-c", "x = bytearray(400 << 20)"],
                       "sandbox": {"memory_mb": 128}}}
    async with open_location(tmp_path) as location:
        async with manifest_tools(location, entries):
            outcome = await call(location, "hog", {})
    assert outcome.status == "error"
    assert outcome.error is not None
    assert "it ran out of memory at its sandbox limit (memory_mb = 128" in (
        outcome.error.message), outcome.error.message


async def test_a_command_over_its_cpu_limit_names_it(tmp_path: Path) -> None:
    entries = {"spin": _sh("while :; do :; done", cpu_seconds=1)}
    async with open_location(tmp_path) as location:
        async with manifest_tools(location, entries):
            outcome = await call(location, "spin", {})
    assert outcome.status == "error" and outcome.error is not None
    assert "it reached its sandbox cpu_seconds limit (1 s)" in outcome.error.message, (
        outcome.error.message)


async def test_the_egress_proxy_lets_listed_destinations_through_only(
    tmp_path: Path, listening: int, caplog: pytest.LogCaptureFixture
) -> None:
    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    unlisted = other.server_address[1]
    script = (f"curl -s -p -m 10 http://127.0.0.1:{listening}/; echo allowed=$?; "
              f"curl -s -p -m 10 http://127.0.0.1:{unlisted}/; echo refused=$?; "
              f"curl -s --noproxy '*' -m 5 http://127.0.0.1:{listening}/; echo direct=$?")
    entries = {"net": _sh(script, network=[f"127.0.0.1:{listening}"])}
    try:
        with caplog.at_level(logging.INFO, logger="bridges.sandbox.egress"):
            async with open_location(tmp_path) as location:
                async with manifest_tools(location, entries):
                    outcome = await call(location, "net", {})
    finally:
        other.shutdown()
        other.server_close()
    assert outcome.status == "completed", outcome.error
    text = outcome.content[0].text  # type: ignore[union-attr]
    assert "okallowed=0" in text, text
    assert "refused=56" in text, text  # curl: the proxy answered 403 to CONNECT
    assert "direct=7" in text, text  # no network but the proxy
    logged = [r.getMessage() for r in caplog.records if r.name == "bridges.sandbox.egress"]
    assert f"[net] egress: CONNECT 127.0.0.1:{listening}" in logged, logged
    assert (f"[net] egress refused: CONNECT 127.0.0.1:{unlisted} (not in sandbox.network)"
            in logged), logged


async def test_without_bwrap_a_sandboxed_entry_does_not_start(
    tmp_path: Path, location: Location, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap there
    entries = {"run": {"kind": "command", "description": "d", "input": NOTHING,
                       "argv": ["/bin/echo", "ran"], "sandbox": True}}
    (tmp_path / "loc").mkdir()
    async with open_location(tmp_path / "loc") as loc:
        async with manifest_tools(loc, entries):
            outcome = await call(loc, "run", {})
    assert outcome.status == "error" and outcome.error is not None
    assert outcome.error.message == (
        "run: cannot start '/bin/echo': sandbox: bwrap is not installed (Debian package "
        "bubblewrap; scripts/bootstrap-system installs it)")
    config = ServerConfig.model_validate({"command": "/bin/cat", "sandbox": True})
    async with ServerPool({"s": config}, location.tools) as pool:
        health = pool.health()["s"]
    assert health.state == "failed"
    assert health.last_error == ("cannot start '/bin/cat': sandbox: bwrap is not installed "
                                 "(Debian package bubblewrap; scripts/bootstrap-system "
                                 "installs it)")
