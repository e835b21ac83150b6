"""Stdio servers started before the daemon's imports (`bridges.prestart`) and adopted by the
pool: real processes, a real Location, the SDK test server over real pipes."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest
from mcp.client.stdio import get_default_environment

from bridges.prestart import PRESTARTED, StdioSpec, default_environment, prestart_servers
from sidecar import Location
from tests.bridges.helpers import TESTSERVER, ctx, eventually

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def _nothing_left_waiting():
    yield
    PRESTARTED.discard()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is not alive
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def _manifests(tmp_path: Path, servers: dict[str, dict[str, object]]) -> Path:
    directory = tmp_path / "manifests"
    directory.mkdir(exist_ok=True)
    (directory / "servers.json").write_text(json.dumps({"mcpServers": servers}))
    return directory


def _testserver(**fields: object) -> dict[str, object]:
    return {"command": sys.executable, "args": [str(TESTSERVER)], **fields}


def test_the_inherited_environment_is_the_sdks(monkeypatch):
    monkeypatch.setenv("HOME", "/home/someone")
    monkeypatch.setenv("TERM", "xterm")
    monkeypatch.setenv("SHELL", "() { exported function; }")
    monkeypatch.setenv("NOT_INHERITED", "secret")
    monkeypatch.delenv("LOGNAME", raising=False)
    assert default_environment() == get_default_environment()
    assert "NOT_INHERITED" not in default_environment()
    assert "SHELL" not in default_environment()


async def test_a_prestarted_server_is_adopted_and_stopped_with_the_location(tmp_path):
    manifests = _manifests(tmp_path, {"up": _testserver(env={"MARK": "1"})})
    assert prestart_servers([manifests]) == 1
    [pid] = PRESTARTED.pids()
    async with Location.open(tmp_path, state_dir=tmp_path / "state",
                             manifests=[manifests]) as location:
        assert PRESTARTED.waiting == 0
        assert location.server_health()["up"].pid == pid
        outcome = await location.snapshot().execute("up_echo", {"text": "hi"}, ctx())
        assert outcome.status == "completed", outcome.error
        assert outcome.content[0].text == "hi"
    assert not _alive(pid)


async def test_an_adopted_server_that_dies_is_restarted_as_usual(tmp_path):
    manifests = _manifests(tmp_path, {"up": _testserver()})
    assert prestart_servers([manifests]) == 1
    [pid] = PRESTARTED.pids()
    async with Location.open(tmp_path, state_dir=tmp_path / "state",
                             manifests=[manifests]) as location:
        assert location.server_health()["up"].pid == pid
        os.kill(pid, signal.SIGKILL)
        health = location.server_health
        await eventually(lambda: health()["up"].state == "ready" and health()["up"].pid != pid,
                         within=30, what="a restarted server")
        outcome = await location.snapshot().execute("up_echo", {"text": "again"}, ctx())
        assert outcome.status == "completed", outcome.error
    assert not _alive(pid)


async def test_a_server_whose_entry_changed_is_not_adopted(tmp_path):
    """Adoption needs the same command, arguments, environment and cwd."""
    manifests = _manifests(tmp_path, {"up": _testserver(env={"MARK": "before"})})
    assert prestart_servers([manifests]) == 1
    [stale] = PRESTARTED.pids()
    manifests = _manifests(tmp_path, {"up": _testserver(env={"MARK": "after"})})
    async with Location.open(tmp_path, state_dir=tmp_path / "state",
                             manifests=[manifests]) as location:
        assert location.server_health()["up"].pid != stale
        assert PRESTARTED.pids() == [stale]
    _discard_and_check_reaped(stale)


def _discard_and_check_reaped(pid: int) -> None:
    assert PRESTARTED.discard() == 1
    assert not _alive(pid)
    with pytest.raises(ChildProcessError):  # reaped, not left a zombie
        os.waitpid(pid, os.WNOHANG)


def test_what_is_not_started_is_not_prestarted(tmp_path):
    manifests = _manifests(tmp_path, {
        "off": _testserver(disabled=True),
        "remote": {"url": "http://127.0.0.1:9/mcp"},
        "broken": {"command": 42},
        "missing": {"command": str(tmp_path / "no-such-program")},
    })
    assert prestart_servers([manifests]) == 0
    assert prestart_servers([tmp_path / "no-such-directory"]) == 0
    assert prestart_servers([]) == 0
    assert PRESTARTED.waiting == 0


def test_specs_match_on_what_starts_the_process():
    spec = StdioSpec(command="a", args=("b",), env={"X": "1"}, cwd=None, max_message_bytes=1)
    same = StdioSpec(command="a", args=("b",), env={"X": "1"}, cwd=None, max_message_bytes=9)
    assert spec.key() == same.key()
    for other in (StdioSpec("a", ("c",), {"X": "1"}, None, 1),
                  StdioSpec("a", ("b",), {"X": "2"}, None, 1),
                  StdioSpec("a", ("b",), {"X": "1"}, "/tmp", 1)):
        assert other.key() != spec.key()


async def test_a_claimed_server_that_cannot_be_adopted_is_killed_and_spawned_anew(
    tmp_path, monkeypatch
):
    from bridges.mcp import stdio

    async def refuse(process):
        raise OSError("no pipes today")

    manifests = _manifests(tmp_path, {"up": _testserver()})
    assert prestart_servers([manifests]) == 1
    [pid] = PRESTARTED.pids()
    monkeypatch.setattr(stdio._Adopted, "of", refuse)
    async with Location.open(tmp_path, state_dir=tmp_path / "state",
                             manifests=[manifests]) as location:
        assert PRESTARTED.waiting == 0
        health = location.server_health
        await eventually(lambda: health()["up"].state == "ready", within=30,
                         what="the server spawned after the failed adoption")
        assert health()["up"].pid != pid
        assert not _alive(pid)
