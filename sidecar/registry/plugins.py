"""Plugins: code that receives only the narrow `Tools` capability.

A plugin is `activate(tools: Tools) -> None | Awaitable[None]`, named by a dotted reference
(`"package.module:function"`) in a manifest's `plugins` list, or published under the Python
entry-point group `mcp_sidecar.plugins`.

Each activation gets a fresh plugin-owned `Tools`: every scope the plugin registers through it
belongs to that activation, and deactivation (manifest change, Location close, shutdown)
closes exactly those. A plugin that raises during activation is reported (log and
`PluginHost.status`) and leaves no registrations behind; other plugins still load.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from sidecar.model.tool import Tool
from sidecar.registry.registry import Registry, Scope, Tools

ENTRY_POINT_GROUP = "mcp_sidecar.plugins"

log = logging.getLogger("sidecar.registry.plugins")

Activate = Callable[[Tools], Awaitable[None] | None]


class PluginTools(Tools):
    """A `Tools` whose scopes belong to one plugin activation."""

    __slots__ = ("_plugin", "_scopes")

    def __init__(self, registry: Registry, plugin: str) -> None:
        super().__init__(registry)
        self._plugin = plugin
        self._scopes: list[Scope] = []

    def register(
        self, mapping: Mapping[str, Tool], *, namespace: str | None = None, label: str = ""
    ) -> Scope:
        scope = super().register(mapping, namespace=namespace, label=label or self._plugin)
        self._scopes.append(scope)
        return scope

    def close_all(self) -> None:
        for scope in reversed(self._scopes):
            scope.close()
        self._scopes.clear()


@dataclass(frozen=True, slots=True)
class PluginStatus:
    ref: str
    state: Literal["active", "failed"]
    error: str | None = None
    tools: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"ref": self.ref, "state": self.state, "tools": list(self.tools)}
        if self.error is not None:
            data["error"] = self.error
        return data


def resolve(ref: str) -> Activate:
    """Import `package.module:function`; raise `ImportError`/`AttributeError` with the ref."""
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise ImportError(f"plugin reference {ref!r} must look like 'package.module:function'")
    target: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise TypeError(f"plugin {ref!r} is not callable")
    return target  # type: ignore[no-any-return]


def entry_point_refs() -> list[str]:
    """Plugin references published by installed distributions."""
    return [ep.value for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)]


class PluginHost:
    """Activates and deactivates plugins of one registry."""

    def __init__(self, registry: Registry) -> None:
        self._registry = registry
        self._active: dict[str, PluginTools] = {}
        self._status: dict[str, PluginStatus] = {}

    @property
    def status(self) -> dict[str, PluginStatus]:
        return dict(self._status)

    async def activate(self, ref: str) -> PluginStatus:
        if ref in self._active:
            return self._status[ref]
        tools = PluginTools(self._registry, f"plugin:{ref}")
        try:
            activate = resolve(ref)
            result = activate(tools)
            if inspect.isawaitable(result):
                await result
        except Exception as exc:
            tools.close_all()  # no partial registrations
            log.error("plugin %s failed to activate: %s", ref, exc, exc_info=exc)
            status = PluginStatus(ref, "failed", f"{type(exc).__name__}: {exc}")
        else:
            self._active[ref] = tools
            names = tuple(name for scope in tools._scopes for name in scope.names)
            status = PluginStatus(ref, "active", tools=names)
        self._status[ref] = status
        return status

    def deactivate(self, ref: str) -> None:
        tools = self._active.pop(ref, None)
        if tools is not None:
            tools.close_all()
        self._status.pop(ref, None)

    async def sync(self, refs: Iterable[str]) -> None:
        """Make the active set equal `refs`: new ones activate, missing ones deactivate,
        failed ones are retried, unchanged active ones are not touched."""
        wanted = list(dict.fromkeys(refs))
        for ref in list(self._status):
            if ref not in wanted:
                self.deactivate(ref)
        for ref in wanted:
            if ref not in self._active:
                await self.activate(ref)

    def close(self) -> None:
        for ref in reversed(list(self._active)):
            self.deactivate(ref)
        self._status.clear()
