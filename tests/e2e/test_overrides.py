"""Tool overrides on a real MCP test server: renamed, redescribed, hidden arguments, per
profile, and collisions refused on reload."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
import pytest

from sidecar import Location, ToolContext
from sidecar.model.events import ManifestsReloaded
from tests.bridges.helpers import TESTSERVER

pytestmark = pytest.mark.anyio

OVERRIDES = """
[tools.overrides."alpha_echo"]
name = "say"
description_append = "Always says the fixed text."
hidden = { text = "FIXED by the manifest" }
annotations = { read_only = true, title = "Say" }

[tools.overrides."alpha_crash"]
enabled = false

[profiles.calc.overrides."alpha_add"]
name = "plus"
description = "Add b (default 10) to a."
defaults = { b = 10 }

[profiles.calc]
include = ["alpha_add", "say"]
"""


def write(directory: Path, overrides: str = OVERRIDES) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    servers = {"alpha": {"command": sys.executable, "args": [str(TESTSERVER)],
                         "overrides": {"slow": {"description": "server-level: sleeps"}}}}
    (directory / "servers.json").write_text(json.dumps({"mcpServers": servers}))
    tmp = directory / "overrides.tmp"
    tmp.write_text(overrides)
    tmp.replace(directory / "overrides.toml")
    return directory


def ctx(call_id: str) -> ToolContext:
    return ToolContext("s", "a", "m", call_id)


async def ready(location: Location) -> None:
    with anyio.fail_after(30):
        while "alpha_add" not in location.registry.effective():  # noqa: ASYNC110
            await anyio.sleep(0.05)


async def test_an_override_renames_a_tool_and_hides_an_argument(tmp_path: Path) -> None:
    manifests = write(tmp_path / "m")
    async with Location.open(tmp_path, state_dir=tmp_path / "s", manifests=[manifests]) as loc:
        await ready(loc)
        assert not loc.manifests.errors, loc.manifests.problems
        snap = loc.snapshot()
        defs = {d.name: d for d in snap.definitions}
        assert "alpha_echo" not in defs and "alpha_crash" not in defs
        say = defs["say"]
        assert say.description == "Echo the text back\n\nAlways says the fixed text."
        assert "text" not in say.input_schema["properties"]
        assert "required" not in say.input_schema
        assert say.title == "Echo" and say.annotations == {"title": "Say",
                                                          "read_only_hint": True}
        assert defs["alpha_slow"].description == "server-level: sleeps"
        # the model sends nothing (or tries its own text): the upstream gets the fixed value
        done = await snap.execute("say", {}, ctx("o1"))
        assert done.status == "completed", done
        assert done.content[0].text == "FIXED by the manifest"
        tried = await snap.execute("say", {"text": "model text"}, ctx("o2"))
        assert tried.content[0].text == "FIXED by the manifest"
        old = await snap.execute("alpha_echo", {"text": "x"}, ctx("o3"))
        assert old.error is not None and old.error.kind == "unknown_tool"
        gone = await snap.execute("alpha_crash", {}, ctx("o4"))
        assert gone.error is not None and gone.error.kind == "unknown_tool"
        assert loc.server_health()["alpha"].state == "ready"


async def test_profile_overrides_apply_in_that_profile_only(tmp_path: Path) -> None:
    manifests = write(tmp_path / "m")
    async with Location.open(tmp_path, state_dir=tmp_path / "s", manifests=[manifests]) as loc:
        await ready(loc)
        calc = loc.snapshot(profile="calc")
        assert set(calc.names) == {"plus", "say", "managed_read"}
        plus = next(d for d in calc.definitions if d.name == "plus")
        assert plus.input_schema["required"] == ["a"]
        assert plus.input_schema["properties"]["b"]["default"] == 10
        added = await calc.execute("plus", {"a": 1}, ctx("p1"))
        assert added.output == {"sum": 11}, added
        given = await calc.execute("plus", {"a": 1, "b": 2}, ctx("p2"))
        assert given.output == {"sum": 3}
        invalid = await calc.execute("plus", {"a": "one"}, ctx("p3"))
        assert invalid.error is not None and invalid.error.kind == "invalid_input"
        assert "$.a" in (invalid.error.path or "")
        everything = loc.snapshot()
        assert "alpha_add" in everything.names and "plus" not in everything.names


async def test_a_rename_that_collides_fails_the_reload_naming_both(tmp_path: Path) -> None:
    manifests = write(tmp_path / "m")
    async with Location.open(tmp_path, state_dir=tmp_path / "s", manifests=[manifests],
                             watch=True) as loc:
        await ready(loc)
        async with loc.events.subscribe() as sub:
            write(manifests, OVERRIDES + '\n[tools.overrides."alpha_fail"]\nname = "say"\n')
            with anyio.fail_after(30):
                while True:
                    event = await sub.next()
                    if isinstance(event, ManifestsReloaded):
                        break
        assert not event.ok
        message = json.dumps(event.problems)
        assert "alpha_echo" in message and "alpha_fail" in message and "'say'" in message
        assert loc.sources is not None and loc.sources.reload_problems
        # the last good overrides keep serving
        names = loc.snapshot().names
        assert "say" in names and "alpha_fail" in names


EVERYTHING = (Path(__file__).resolve().parents[2] / ".deps" / "npm" / "node_modules" /
              "@modelcontextprotocol" / "server-everything" / "dist" / "index.js")


async def test_an_override_reshapes_a_published_server_tool(tmp_path: Path) -> None:
    """server-everything (npm): its echo renamed, its only argument fixed."""
    assert EVERYTHING.exists(), "run scripts/bootstrap-servers first"
    directory = tmp_path / "m"
    directory.mkdir()
    (directory / "ev.toml").write_text(f"""
[mcpServers.ev]
command = "node"
args = [{json.dumps(str(EVERYTHING))}, "stdio"]

[tools.overrides."ev_echo"]
name = "shout"
description = "Say the fixed line."
hidden = {{ message = "fixed by the override" }}
""")
    async with Location.open(tmp_path, state_dir=tmp_path / "s", manifests=[directory]) as loc:
        with anyio.fail_after(60):
            while "shout" not in loc.snapshot(keep=False).names:  # noqa: ASYNC110
                await anyio.sleep(0.05)
        shout = next(d for d in loc.snapshot().definitions if d.name == "shout")
        assert shout.description == "Say the fixed line."
        assert "message" not in shout.input_schema.get("properties", {})
        done = await loc.snapshot().execute("shout", {}, ctx("ev1"))
        assert done.status == "completed", done
        assert done.content[0].text == "Echo: fixed by the override"
        assert "ev_echo" not in loc.snapshot().names
