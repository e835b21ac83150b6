"""Live manifest reload: files edited on disk while the daemon runs and calls are in flight."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import psutil
import pytest

from sidecar import Location, ToolContext
from sidecar.model.errors import ErrorKind
from sidecar.model.events import ManifestsReloaded
from tests.bridges.helpers import TESTSERVER

pytestmark = pytest.mark.anyio


def server(**extra) -> dict:
    return {"command": sys.executable, "args": [str(TESTSERVER)], **extra}


def command_tool(word: str) -> dict:
    return {
        "kind": "command",
        "description": f"say {word}",
        "input": {"type": "object", "properties": {"who": {"type": "string"}}},
        "argv": [sys.executable, "-c", f"import sys; print('{word}', *sys.argv[1:])", "{who}"],
    }


def write(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)  # atomic, as editors and config tools do


_ids = iter(range(1_000_000))


def ctx() -> ToolContext:
    return ToolContext("s", "a", "m", f"r{next(_ids)}")


async def wait_for(predicate, limit: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + limit
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)


async def next_reload(sub) -> ManifestsReloaded:
    while True:
        event = await asyncio.wait_for(sub.next(), 30)
        if isinstance(event, ManifestsReloaded):
            return event


async def test_reload_applies_only_the_difference_and_keeps_calls_running(tmp_path):
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    main = manifests / "main.json"
    write(main, {"mcpServers": {"one": server(), "gone": server()},
                 "tools": {"hello": command_tool("hello")}})
    async with Location.open(tmp_path, state_dir=tmp_path / "state", manifests=[manifests],
                             watch=True) as loc:
        await wait_for(lambda: all(h.state == "ready" for h in loc.server_health().values()))
        pid_one = loc.server_health()["one"].pid
        pid_gone = loc.server_health()["gone"].pid
        snap = loc.snapshot()
        before = await snap.execute("hello", {"who": "x"}, ctx())
        assert before.content[0].text.strip() == "hello x"
        # a call in flight on "one" (unchanged) and one on "gone" (removed)
        slow_one = asyncio.create_task(snap.execute("one_slow", {"seconds": 1.0}, ctx()))
        slow_gone = asyncio.create_task(snap.execute("gone_slow", {"seconds": 30}, ctx()))
        await asyncio.sleep(0.3)
        async with loc.events.subscribe() as sub:
            write(main, {"mcpServers": {"one": server(), "two": server()},
                         "tools": {"hello": command_tool("bonjour")}})
            reloaded = await next_reload(sub)
        assert reloaded.ok
        await wait_for(lambda: loc.server_health().get("two") is not None
                       and loc.server_health()["two"].state == "ready")
        health = loc.server_health()
        assert set(health) == {"one", "two"}
        assert health["one"].pid == pid_one  # unchanged: not restarted
        assert not psutil.pid_exists(pid_gone) or psutil.Process(pid_gone).status() == "zombie"
        done = await slow_one  # the in-flight call on the untouched server finished
        assert done.status == "completed"
        gone = await slow_gone  # its server was removed: a clean error, never a hang
        assert gone.status == "error" and gone.error.kind is ErrorKind.UPSTREAM
        fresh = loc.snapshot()
        assert "two_echo" in fresh.names and "gone_echo" not in fresh.names
        after = await fresh.execute("hello", {"who": "x"}, ctx())
        assert after.content[0].text.strip() == "bonjour x"
        assert (await snap.execute("hello", {"who": "y"}, ctx())).content[0].text.strip() == (
            "hello y")  # the old snapshot still runs the tool it captured


async def test_invalid_reload_keeps_the_last_good_configuration(tmp_path):
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    main = manifests / "main.json"
    write(main, {"tools": {"hello": command_tool("hello")}})
    async with Location.open(tmp_path, state_dir=tmp_path / "state", manifests=[manifests],
                             watch=True) as loc:
        async with loc.events.subscribe() as sub:
            main.write_text('{"tools": {"hello": ')  # a half-written file
            first = await next_reload(sub)
            assert not first.ok and "invalid JSON" in first.problems[0]["message"]
            write(main, {"tools": {"hello": {**command_tool("x"), "argv": ["{nope}"]}}})
            second = await next_reload(sub)
        assert not second.ok
        assert second.problems[0]["path"].startswith("$.tools.hello")
        health = await loc.health()
        assert health["status"] == "degraded" and health["reload_problems"]
        still = await loc.snapshot().execute("hello", {"who": "z"}, ctx())
        assert still.content[0].text.strip() == "hello z"
        async with loc.events.subscribe() as sub:
            write(main, {"tools": {"hello": command_tool("hi")}})
            fixed = await next_reload(sub)
        assert fixed.ok and (await loc.health())["reload_problems"] == []
        hi = await loc.snapshot().execute("hello", {"who": "z"}, ctx())
        assert hi.content[0].text.strip() == "hi z"
