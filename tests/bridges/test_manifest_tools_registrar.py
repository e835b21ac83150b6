"""The registrar: one scope, swapped in place, precedence kept, in-flight calls undisturbed."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest

from bridges.manifest.loading import load_manifests
from bridges.manifest_tools import ManifestTools, manifest_tool_validator
from sidecar import ErrorKind, Tool, ToolResponse
from sidecar.model.errors import RegistrationError
from tests.bridges.manifest_tools_support.location import (
    call,
    eventually,
    open_location,
    validated,
)

pytestmark = pytest.mark.anyio


@pytest.fixture
async def location(tmp_path):
    async with open_location(tmp_path) as opened:
        yield opened

NOTHING: dict[str, Any] = {"type": "object", "properties": {}}


def echo(text: str, **keys: Any) -> dict[str, Any]:
    return {"kind": "command", "description": f"prints {text}", "input": NOTHING,
            "argv": [sys.executable, "-c", f"print({text!r})"], **keys}


def plain_tool(text: str) -> Tool:
    async def run(args: Any, ctx: Any) -> ToolResponse:
        return ToolResponse(content=text)

    return Tool(description="plain", input=NOTHING, execute=run)


def registrar(location) -> ManifestTools:
    return ManifestTools(location.tools, location.seam.store, location.root,
                         location.permissions, store_namespace=location.name)


async def text_of(location, name: str) -> str:
    outcome = await call(location, name, {})
    assert outcome.status == "completed", outcome.error
    return outcome.content[0].text.strip()


async def test_apply_swaps_the_set_in_place_and_keeps_precedence(location):
    earlier = location.tools.register({"shadowed": plain_tool("earlier")}, label="earlier")
    async with registrar(location) as tools:
        await tools.apply({"shadowed": validated(location, "shadowed", echo("manifest v1")),
                           "gone": validated(location, "gone", echo("gone"))})
        later = location.tools.register({"winner": plain_tool("later")}, label="later")
        assert await text_of(location, "shadowed") == "manifest v1"  # newer than `earlier`

        await tools.apply({"shadowed": validated(location, "shadowed", echo("manifest v2")),
                           "winner": validated(location, "winner", echo("manifest"))})
        assert await text_of(location, "shadowed") == "manifest v2"
        assert await text_of(location, "winner") == "later"  # still below `later`
        assert set(tools.names) == {"shadowed", "winner"}
        removed = await call(location, "gone", {})
        assert removed.error.kind is ErrorKind.UNKNOWN_TOOL

        later.close()
        assert await text_of(location, "winner") == "manifest"
    assert await text_of(location, "shadowed") == "earlier"  # aclose removed exactly its scope
    earlier.close()


async def test_an_unchanged_config_keeps_its_tool_value(location):
    async with registrar(location) as tools:
        await tools.apply({"a": validated(location, "a", echo("a")),
                           "b": validated(location, "b", echo("b"))})
        before = dict(location.registry.effective())
        await tools.apply({"a": validated(location, "a", echo("a")),
                           "b": validated(location, "b", echo("b changed"))})
        after = location.registry.effective()
    assert after["a"].tool is before["a"].tool
    assert after["b"].tool is not before["b"].tool


async def test_a_set_that_cannot_register_changes_nothing(location):
    async with registrar(location) as tools:
        await tools.apply({"git_log": validated(location, "git_log", echo("kept"))})
        clash = {
            "log": validated(location, "log", echo("x", namespace="git")),
            "git_log": validated(location, "git_log", echo("y")),
        }
        with pytest.raises(RegistrationError, match="both become 'git_log'"):
            await tools.apply(clash)
        with pytest.raises(RegistrationError, match="expected a validated manifest tool"):
            await tools.apply({"raw": {"kind": "command"}})  # type: ignore[dict-item]
        assert await text_of(location, "git_log") == "kept"


async def test_a_call_in_flight_finishes_on_the_tool_it_captured(location, tmp_path):
    started = tmp_path / "started"
    slow = {"kind": "command", "description": "slow", "input": NOTHING,
            "argv": [sys.executable, "-c",
                     f"import time; open({str(started)!r}, 'w'); time.sleep(0.5); print('old')"]}
    async with registrar(location) as tools:
        await tools.apply({"slow": validated(location, "slow", slow)})
        task = asyncio.create_task(call(location, "slow", {}, call_id="inflight"))
        await eventually(started.exists)
        await tools.apply({})  # a reload that removes the tool
        outcome = await task
        assert tools.names == ()
    assert outcome.status == "completed" and outcome.content[0].text == "old\n"


async def test_closed_registrar_refuses_to_apply(location):
    tools = registrar(location)
    await tools.apply({"a": validated(location, "a", echo("a"))})
    await tools.aclose()
    await tools.aclose()  # idempotent
    assert "a" not in location.registry.effective()
    with pytest.raises(RegistrationError, match="closed"):
        await tools.apply({})


async def test_manifests_load_and_apply_the_way_the_composition_root_wires_them(
    location, tmp_path
):
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "tools.json").write_text(
        '{"tools": {"hello": {"kind": "command", "description": "hello", "namespace": "demo",'
        ' "input": {"type": "object", "properties": {"who": {"type": "string"}}},'
        f' "argv": ["{sys.executable}", "-c", "import sys; print(\'hello\', *sys.argv[1:])",'
        ' "{who}"]},'
        ' "broken": {"kind": "command", "description": "x", "input": {"type": "object"},'
        ' "argv": ["true"], "cwd": "../outside"}}}'
    )
    loaded = load_manifests([manifests], tool_validator=manifest_tool_validator(location.root))
    assert [(p.path, p.message) for p in loaded.errors] == [
        ("$.tools.broken.cwd", "cwd '../outside' escapes the Location root")
    ]
    async with registrar(location) as tools:
        await tools.apply(loaded.tools)
        assert tools.names == ("demo_hello",)
        outcome = await call(location, "demo_hello", {"who": "world"})
    assert outcome.content[0].text == "hello world\n"


async def test_the_http_client_is_built_with_the_first_http_tool_and_closed_with_the_registrar(
    location,
):
    http = {"kind": "http", "description": "get", "input": NOTHING,
            "request": {"method": "GET", "url": "http://127.0.0.1:9/x"}}
    tools = registrar(location)
    await tools.apply({"cmd": validated(location, "cmd", echo("x"))})
    assert tools._client.client is None  # no SSL context loaded for a Location without http tools
    await tools.apply({"cmd": validated(location, "cmd", echo("x")),
                       "get": validated(location, "get", http)})
    client = tools._client.client
    assert client is not None and not client.is_closed
    await tools.aclose()
    assert client.is_closed
