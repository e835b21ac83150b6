"""A Location with manifest tools wired as the composition root wires them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from bridges.manifest_tools import ManifestTools, manifest_tool_validator
from sidecar import Location, Outcome, ToolContext

INPUT_A = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}


def context(call_id: str = "c1", session: str = "s1") -> ToolContext:
    return ToolContext(session_id=session, agent="agent", message_id="m1", call_id=call_id)


def validated(location: Location, key: str, raw: Mapping[str, Any]) -> Any:
    config, problems = manifest_tool_validator(location.root)(
        "test.toml", f"$.tools.{key}", dict(raw)
    )
    assert config is not None, [str(p) for p in problems]
    assert problems == []
    return config


@asynccontextmanager
async def manifest_tools(
    location: Location, entries: Mapping[str, Mapping[str, Any]], *, gate: bool = True
) -> AsyncIterator[ManifestTools]:
    configs = {key: validated(location, key, raw) for key, raw in entries.items()}
    async with ManifestTools(
        location.tools,
        location.seam.store,
        location.root,
        location.permissions if gate else None,
        store_namespace=location.name,
    ) as registrar:
        await registrar.apply(configs)
        yield registrar


_calls = iter(range(1, 1_000_000))


async def call(location: Location, name: str, args: Any, call_id: str | None = None) -> Outcome:
    return await location.snapshot().execute(
        name, args, context(call_id or f"call-{next(_calls)}")
    )


@asynccontextmanager
async def open_location(tmp_path: Path) -> AsyncIterator[Location]:
    """A real Location on a temp root (`<tmp>/root`) and state dir, no entry-point plugins."""
    root = tmp_path / "root"
    root.mkdir()
    async with Location.open(
        root, state_dir=tmp_path / "state", entry_point_plugins=False
    ) as opened:
        yield opened


async def eventually(predicate: Callable[[], bool], within: float = 10.0) -> None:
    """Wait until `predicate()` holds (polled every 10 ms); fail after `within` seconds."""
    for _ in range(int(within / 0.01)):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"condition not met within {within} s")
