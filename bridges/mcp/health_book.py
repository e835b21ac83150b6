"""A server's published health: `HealthBook` keeps its `ServerHealth` (a new snapshot on every
change; the last call's latency folded in when it is read), wakes whoever waits for a state
change (`state_changed`) and tells the pool's listeners (`HealthListener`, `ToolsListener`); a
listener that raises is logged, never propagated. Imports `bridges.mcp.health`; exports
`HealthBook`, `HealthListener`, `ToolsListener`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

import anyio

from bridges.mcp.health import ServerHealth

log = logging.getLogger("bridges.mcp")

HealthListener = Callable[[str, ServerHealth], None]
ToolsListener = Callable[[str], None]


class HealthBook:
    """One server's health and the listeners told of it."""

    __slots__ = ("_health", "_latency_ms", "_on_health", "_on_tools_changed", "key",
                 "state_changed")

    def __init__(self, key: str, health: ServerHealth, on_health: HealthListener | None,
                 on_tools_changed: ToolsListener | None) -> None:
        self.key = key
        self._health = health
        self._on_health = on_health
        self._on_tools_changed = on_tools_changed
        self.state_changed = anyio.Event()
        """Set (and replaced) whenever the state changes."""
        self._latency_ms: float | None = None  # the last call's, until `health` folds it in

    @property
    def health(self) -> ServerHealth:
        """The server's health; the last call's latency is folded in when it is read."""
        if self._latency_ms is not None:
            self._health = dataclasses.replace(self._health, last_call_latency_ms=self._latency_ms)
            self._latency_ms = None
        return self._health

    def record_latency(self, ms: float) -> None:
        # No on_health event (one per call would flood listeners) and no new ServerHealth per
        # call: `health` builds one when it is read.
        self._latency_ms = round(ms, 3)

    def set(self, **changes: Any) -> None:
        health = self.health
        state_changed = "state" in changes and changes["state"] != health.state
        if state_changed:
            changes["since"] = time.time()
        updated = dataclasses.replace(health, **changes)
        if updated == health:
            return
        self._health = updated
        if state_changed:
            self.state_changed.set()
            self.state_changed = anyio.Event()
        if self._on_health is not None:
            try:
                self._on_health(self.key, updated)
            except Exception:
                log.exception("[%s] on_health callback raised", self.key)

    def tools_changed(self) -> None:
        if self._on_tools_changed is not None:
            try:
                self._on_tools_changed(self.key)
            except Exception:
                log.exception("[%s] on_tools_changed callback raised", self.key)
