"""The event log's port: a Location's events, each with an increasing id, for readers that
resume by id (`/v1/events`, Server-Sent Events), and the numbered event every implementation
hands out (`LoggedEvent`, its name and JSON encoded when first read).

Imports `sidecar.model`. Exports `EventLog`, `EventLogFactory`, `NumberedEvent`,
`LoggedEvent`, `encode_event` and `EVENT_NAMES` (implementations:
`sidecar.backends.local.event_log`, `sidecar.backends.postgres.event_log`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import asdict
from typing import Any, Protocol

from sidecar.model.events import (
    CallProgress,
    CallSettled,
    DefinitionChanged,
    Event,
    EventBus,
    ManifestsReloaded,
    PermissionAsked,
    PermissionReplied,
    RegistryChanged,
    ServerHealthChanged,
)

__all__ = ["EVENT_NAMES", "EventLog", "EventLogFactory", "LoggedEvent", "NumberedEvent",
           "encode_event"]

_NAMES: dict[type[Any], str] = {
    CallProgress: "call.progress",
    CallSettled: "call.settled",
    PermissionAsked: "permission.asked",
    PermissionReplied: "permission.replied",
    RegistryChanged: "registry.changed",
    ServerHealthChanged: "server.health",
    ManifestsReloaded: "manifests.reloaded",
    DefinitionChanged: "tool.definition_changed",
}
EVENT_NAMES: tuple[str, ...] = tuple(_NAMES.values())


class NumberedEvent(Protocol):
    """One event of an `EventLog`, ready for Server-Sent Events."""

    @property
    def id(self) -> int: ...

    @property
    def name(self) -> str: ...

    @property
    def data(self) -> str:
        """JSON."""
        ...

    def sse(self) -> str:
        """The event as one Server-Sent Events message (`id`, `event`, `data`)."""
        ...


class EventLog(Protocol):
    """A Location's events, each with an increasing id, for readers that resume by id."""

    async def start(self) -> None:
        """Begin logging the bus's events; every event published after this returns is kept."""
        ...

    async def aclose(self) -> None: ...

    @property
    def last_id(self) -> int:
        """The id of the newest event (0: none yet)."""
        ...

    def after(self, last_id: int) -> tuple[Sequence[NumberedEvent], int]:
        """The kept events after `last_id`, oldest first, and how many events after it are
        no longer kept."""
        ...

    def follow(self, last_id: int | None) -> AsyncIterator[NumberedEvent]:
        """Events after `last_id` (None: only new ones), forever; a `stream.reset` event
        first when some after `last_id` are no longer kept."""
        ...


EventLogFactory = Callable[[EventBus], EventLog]
"""Builds a Location's event log over its bus (not started: a frontend starts it)."""


class LoggedEvent:
    """One numbered event. Its JSON is encoded when first read: most events never are (readers
    of /v1/events are rare), and encoding every call's outcome up front cost about 2.5 % of
    the daemon's CPU per call on /mcp."""

    __slots__ = ("_encoded", "_event", "id")

    def __init__(self, id: int, event: Event | None, encoded: tuple[str, str] | None = None):
        self.id = id
        self._event = event
        self._encoded = encoded

    def _encode(self) -> tuple[str, str]:
        if self._encoded is None:
            assert self._event is not None
            self._encoded = encode_event(self._event)
            self._event = None
        return self._encoded

    @property
    def name(self) -> str:
        return self._encode()[0]

    @property
    def data(self) -> str:
        """JSON."""
        return self._encode()[1]

    def sse(self) -> str:
        return f"id: {self.id}\nevent: {self.name}\ndata: {self.data}\n\n"


def encode_event(event: Event) -> tuple[str, str]:
    return _NAMES[type(event)], json.dumps(asdict(event), ensure_ascii=False)
